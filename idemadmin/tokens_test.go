package idemadmin_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemadmin"
)

// A token file as an operator writes it, with a token that holds colons
// (written, as the file format requires, with its name) and Windows line
// ends.
const (
	colonToken = "col:on:token-0123456789"
	tokenText  = "# admin tokens\r\nops:" + opsToken + "\r\nalice:" + aliceToken + "\r\ncarol:" + colonToken + "\r\n"
)

// TestSignInWithWhatTheDocsSay: the page, the API and the client accept a
// token alone or a whole line of the token file, copied with its
// surroundings, and act under that line's name; a name alone, a token
// under another name, or a line cut wrong is refused.
func TestSignInWithWhatTheDocsSay(t *testing.T) {
	t.Parallel()
	tokens, err := idemadmin.ParseTokens(tokenText)
	if err != nil {
		t.Fatal(err)
	}
	// Every wrong try below comes from one address: allow them all.
	f := newFixture(t, func(c *idemadmin.Config) { c.Tokens, c.SignInFailures = tokens, 100 })
	for _, tc := range []struct {
		what, presented, name string // name "" means refused
	}{
		{"the token", opsToken, "ops"},
		{"the whole line", "ops:" + opsToken, "ops"},
		{"the line with its newline", "ops:" + opsToken + "\n", "ops"},
		{"the line with its CRLF", "ops:" + opsToken + "\r\n", "ops"},
		{"the line among spaces and tabs", " \tops:" + opsToken + " \t", "ops"},
		{"another line", "alice:" + aliceToken, "alice"},
		{"a token with colons", colonToken, "carol"},
		{"a line whose token has colons", "carol:" + colonToken, "carol"},
		{"a token under another's name", "alice:" + opsToken, ""},
		{"a name alone", "ops", ""},
		{"a name and a colon", "ops:", ""},
		{"a colon and the token", ":" + opsToken, ""},
		{"the name in capitals", "OPS:" + opsToken, ""},
		{"a line with a space after the colon", "ops: " + opsToken, ""},
		{"a line with more after the token", "ops:" + opsToken + ":x", ""},
		{"two lines", "ops:" + opsToken + "\nalice:" + aliceToken, ""},
		{"a token with colons cut at the first", "col:on:token-0123456789"[4:], ""},
		{"a token with colons under its first part", "col:" + colonToken, ""},
		{"the token twice", opsToken + opsToken, ""},
		{"empty", "", ""},
	} {
		t.Run(tc.what, func(t *testing.T) {
			b := f.browser()
			p := b.do("POST", "/login", url.Values{"token": {tc.presented}})
			switch {
			case tc.name == "" && p.status != http.StatusUnauthorized:
				t.Fatalf("page sign-in with %q: %d, want 401", tc.presented, p.status)
			case tc.name != "" && p.status != http.StatusSeeOther:
				t.Fatalf("page sign-in with %q: %d, want 303:\n%s", tc.presented, p.status, p.body)
			case tc.name != "":
				wantPage(t, "the queue", b.get("/"), 200, "Signed in as <strong>"+tc.name+"</strong>")
			}
			a := f.api("GET", "/api/v1/keys", "", "")
			req, _ := http.NewRequest("GET", f.srv.URL+"/api/v1/keys", nil)
			req.Header.Set("Authorization", "Bearer "+tc.presented)
			if strings.ContainsAny(tc.presented, "\r\n") {
				return // not a header value
			}
			resp, err := f.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			a.status = resp.StatusCode
			if want := map[bool]int{true: 200, false: 401}[tc.name != ""]; a.status != want {
				t.Fatalf("API with %q: %d, want %d", tc.presented, a.status, want)
			}
		})
	}
	// The audit log names who the line names.
	id := f.review(key("k"))
	c, err := idemadmin.NewClient(f.srv.URL, "carol:"+colonToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Resolve(t.Context(), id, idemadmin.ResolveRequest{Action: idemadmin.ActionRelease, Attempt: f.attempt(key("k"))})
	if err != nil || res.By != "carol" {
		t.Fatalf("a release with carol's line: %+v, %v", res, err)
	}
	log := f.log.String()
	for _, s := range []string{`"admin: key resolved" by=carol`, `"admin: signed in" by=carol`, `"admin: signed in" by=ops`} {
		if !strings.Contains(log, s) {
			t.Errorf("the log lacks %q:\n%s", s, log)
		}
	}
	for _, tok := range []string{opsToken, aliceToken, colonToken} {
		if strings.Contains(log, tok) {
			t.Fatalf("the log holds a token:\n%s", log)
		}
	}
}

// TestTokensThatCouldSignInTwice: tokens that would make a presented
// string ambiguous are refused at construction.
func TestTokensThatCouldSignInTwice(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		what   string
		tokens map[string]string
	}{
		{"one token under two names", map[string]string{"ops": opsToken, "admin": opsToken}},
		{"a token that is a name", map[string]string{"ops": opsToken, "carol-is-a-long-name": aliceToken, "bob": "carol-is-a-long-name"}},
		{"a token that is another's line", map[string]string{"ops": opsToken, "alice": "ops:" + opsToken}},
	} {
		f := newFixture(t)
		_, err := idemadmin.New(idemadmin.Config{Store: f.store, Tokens: tc.tokens})
		if err == nil {
			t.Errorf("%s: accepted", tc.what)
		}
		for _, tok := range tc.tokens {
			if err != nil && strings.Contains(err.Error(), tok) {
				t.Errorf("%s: the error shows a token: %v", tc.what, err)
			}
		}
	}
}

// TestCredential: what a command is given (a file or a variable) is read
// as the API reads it: the one line, whole.
func TestCredential(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ text, want string }{
		{opsToken, opsToken},
		{opsToken + "\n", opsToken},
		{"ops:" + opsToken + "\r\n", "ops:" + opsToken},
		{"\ufeff# written on Windows\r\n\r\nops:" + opsToken + "\r\n", "ops:" + opsToken},
		{"carol:" + colonToken, "carol:" + colonToken},
		{"  admin:" + colonToken + "  ", "admin:" + colonToken},
	} {
		got, err := idemadmin.Credential(tc.text)
		if err != nil || got != tc.want {
			t.Errorf("Credential(%q) = %q, %v; want %q", tc.text, got, err, tc.want)
		}
	}
	for _, text := range []string{"", "# nothing\n", "ops", "ops:short", tokenText, "ops:" + opsToken + " trailing"} {
		if got, err := idemadmin.Credential(text); err == nil {
			t.Errorf("Credential(%q) = %q, accepted", text, got)
		}
	}
}

// TestParseTokensByteOrderMark: a token file whose editor wrote a byte
// order mark reads as one without.
func TestParseTokensByteOrderMark(t *testing.T) {
	t.Parallel()
	tokens, err := idemadmin.ParseTokens("\ufeffops:" + opsToken + "\r\n")
	if err != nil || tokens["ops"] != opsToken || len(tokens) != 1 {
		t.Fatalf("ParseTokens with a byte order mark: %v, %v", tokens, err)
	}
}

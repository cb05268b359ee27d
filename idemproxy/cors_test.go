package idemproxy_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemproxy"
)

// TestCORS: for an allowed origin, idem's own answers (a 409, a replay)
// carry Access-Control-Allow-Origin and expose idem's headers; the
// upstream's own answers and preflights keep its CORS policy, with idem's
// headers added when it allowed the origin; other origins get nothing.
func TestCORS(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	cfg := idemproxy.Config{CORSOrigins: []string{"https://app.example.com"}, ProblemBaseURL: "https://api.example.com/problems#",
		Settings: idemproxy.Settings{Anonymous: idemproxy.AnonymousShared}}
	tp := newTestProxyConfig(t, cfg, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodOptions {
			w.Header().Set("Access-Control-Allow-Origin", r.Header.Get("Origin"))
			w.Header().Set("Access-Control-Allow-Methods", "POST")
			w.Header().Set("Access-Control-Allow-Headers", "Content-Type")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if r.URL.Path == "/slow" {
			arrived <- struct{}{}
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	})
	send := func(method, path, key, origin string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, tp.url+path, strings.NewReader("{}"))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		if method == http.MethodOptions {
			req.Header.Set("Access-Control-Request-Method", "POST")
			req.Header.Set("Access-Control-Request-Headers", "idempotency-key, content-type")
		}
		resp, err := tp.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	exposes := func(what string, resp *http.Response) {
		t.Helper()
		exp := resp.Header.Get("Access-Control-Expose-Headers")
		for _, h := range []string{"Idempotent-Replayed", "Idempotency-Outcome", "Retry-After"} {
			if !strings.Contains(exp, h) {
				t.Errorf("%s: Access-Control-Expose-Headers %q lacks %s", what, exp, h)
			}
		}
	}
	const origin = "https://app.example.com"

	pre := send(http.MethodOptions, "/pay", "", origin)
	if pre.StatusCode != http.StatusNoContent || pre.Header.Get("Access-Control-Allow-Methods") != "POST" {
		t.Errorf("preflight did not reach the upstream: %d %v", pre.StatusCode, pre.Header)
	}
	exposes("preflight", pre)
	if got := pre.Header.Get("Access-Control-Allow-Headers"); !strings.Contains(got, "Idempotency-Key") {
		t.Errorf("preflight Access-Control-Allow-Headers %q lacks Idempotency-Key", got)
	}

	done := make(chan *http.Response)
	go func() { done <- send(http.MethodPost, "/slow", "k", origin) }()
	<-arrived // the first /slow holds its key upstream
	conflict := send(http.MethodPost, "/slow", "k", origin)
	close(release)
	first := <-done
	if conflict.StatusCode != http.StatusConflict || conflict.Header.Get("Access-Control-Allow-Origin") != origin || conflict.Header.Get("Vary") != "Origin" {
		t.Errorf("409: %d %v", conflict.StatusCode, conflict.Header)
	}
	exposes("409", conflict)
	if first.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("the upstream's own answer got Access-Control-Allow-Origin: %v", first.Header)
	}
	replay := send(http.MethodPost, "/slow", "k", origin)
	if replay.Header.Get("Idempotent-Replayed") != "true" || replay.Header.Get("Access-Control-Allow-Origin") != origin {
		t.Errorf("replay: %v", replay.Header)
	}
	exposes("replay", replay)

	for _, o := range []string{"", "https://evil.example.com"} {
		r := send(http.MethodPost, "/pay", "", o)
		if r.StatusCode != http.StatusBadRequest || r.Header.Get("Access-Control-Allow-Origin") != "" || r.Header.Get("Access-Control-Expose-Headers") != "" {
			t.Errorf("origin %q: %d %v", o, r.StatusCode, r.Header)
		}
	}
}

func TestCORSAndProblemBaseConfig(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ yaml, want string }{
		{"cors_origins: [https://app.example.com/path]", "must be an origin"},
		{"cors_origins: [app.example.com]", "must be an origin"},
		{"problem_base_url: /problems#", "must be an absolute"},
		{"keep_headers: [Set-Cookie]", "keep_headers: Set-Cookie is never stored"},
		{"include_fields: [amount]", `include_fields: "amount" is not a JSON Pointer`},
	} {
		c, err := idemproxy.ParseConfig([]byte("upstream: http://u\n" + tt.yaml + "\n"))
		if err == nil {
			err = c.WithDefaults().Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.yaml, err, tt.want)
		}
	}
}

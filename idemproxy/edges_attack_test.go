package idemproxy_test

// Attacks on the proxy's HTTP edges (method spellings and overrides, path
// spellings, upgrades, the body budget), as a hostile client would make
// them over raw connections, beyond the cases of the tests of each rule.

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/idem-dev/idem/idemproxy"
)

func TestAttackEdges(t *testing.T) {
	t.Parallel()
	e := newEdgeRig(t, idemproxy.Config{})
	body := `{"amount":1}`
	for i, tc := range []struct {
		name    string
		req     string
		answers []int
	}{
		// Go folds these into one header of two values: they disagree.
		{"an override in two spellings that disagree", post("GET", "/pay", "k1", body, "X-Http-Method-Override", "POST", "x-http-method-override", "DELETE"),
			[]int{http.StatusBadRequest}},
		// The override makes it a protected POST, whose path may not carry ';'.
		{"an override onto a path with a parameter", post("GET", "/pay;x=1", "k2", body, "X-HTTP-Method-Override", "POST"), []int{http.StatusBadRequest}},
		// Marked hop by hop, the override never reaches the upstream; it is
		// protected as a POST all the same (a key is required).
		{"a hop-by-hop override", post("GET", "/pay", "", body, "X-HTTP-Method-Override", "POST", "Connection", "X-HTTP-Method-Override"),
			[]int{http.StatusBadRequest}},
		// A refused spelling does not desync the connection: the next
		// request on it is read as sent.
		{"a misspelt method, pipelined", "post /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k3\r\nContent-Length: 12\r\n\r\n" + body +
			"POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k3\r\nContent-Length: 12\r\nConnection: close\r\n\r\n" + body,
			[]int{http.StatusBadRequest, http.StatusCreated}},
		// A refused path likewise.
		{"a refused path, pipelined", "POST /p;ay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k4\r\nTransfer-Encoding: chunked\r\n\r\nc\r\n" + body + "\r\n0\r\n\r\n" +
			"POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k4\r\nContent-Length: 12\r\nConnection: close\r\n\r\n" + body,
			[]int{http.StatusBadRequest, http.StatusCreated}},
		// An h2c upgrade on a protected request, with its settings.
		{"h2c on a protected POST", post("POST", "/pay", "k5", body, "Connection", "Upgrade, HTTP2-Settings", "Upgrade", "h2c", "HTTP2-Settings", "AAMAAABkAAQAAP__"),
			[]int{http.StatusCreated}},
		// Nor on a misspelt method that its route leaves alone.
		{"h2c on a misspelt GET", "get /x HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, close\r\nUpgrade: h2c\r\n\r\n", []int{http.StatusCreated}},
		// Dot segments cannot climb above the root, in any spelling.
		{"dot segments above the root", post("POST", "/%2e%2E/../pay/./", "k6", body), []int{http.StatusCreated}},
	} {
		got := e.raw(t, tc.req, len(tc.answers)+1)
		var statuses []int
		for _, a := range got {
			statuses = append(statuses, a.Status)
		}
		if fmt.Sprint(statuses) != fmt.Sprint(tc.answers) {
			t.Fatalf("%d, %s: %v; want %v", i, tc.name, got, tc.answers)
		}
	}
	var ran []string
	for _, s := range e.up.requests() {
		ran = append(ran, fmt.Sprintf("%s %s Upgrade=%q", s.Method, s.Target, s.Header.Get("Upgrade")))
	}
	if want := `POST /pay Upgrade="", POST /pay Upgrade="", POST /pay Upgrade="", get /x Upgrade="", POST /pay/ Upgrade=""`; strings.Join(ran, ", ") != want {
		t.Fatalf("the upstream ran %s; want %s", strings.Join(ran, ", "), want)
	}
}

// TestAttackBodyBudgetComesBack: a client that takes its share of the
// body budget and leaves mid-body, and one refused for a bad key after
// taking it, give their shares back: the whole budget serves the next body.
func TestAttackBodyBudgetComesBack(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		tr := memUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusCreated)
		}))
		cfg, err := idemproxy.ParseConfig([]byte("upstream: http://upstream.invalid\nmax_body: 1000\nmax_body_memory: 1001\n"))
		if err != nil {
			t.Fatal(err)
		}
		r := newRig(t, cfg, idemproxy.Options{Transport: tr})
		dial := memFront(t, r.proxy)
		body := strings.Repeat("x", 1000)
		head := func(key string) string {
			return fmt.Sprintf("POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\n\r\n", key, len(body))
		}
		leaver := dial()
		go io.WriteString(leaver, head("a")+body[:10])
		synctest.Wait()
		leaver.Close()
		synctest.Wait()
		for _, tc := range []struct {
			req  string
			want int
		}{
			{head("a b") + body, http.StatusBadRequest}, // a key with a blank: refused after taking its share
			{head("c") + body, http.StatusCreated},
		} {
			c := dial()
			go io.WriteString(c, tc.req)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.want {
				t.Fatalf("%q: %d; want %d", tc.req[:40], resp.StatusCode, tc.want)
			}
			c.Close()
		}
		outlastHeartbeat()
	})
}

// TestLockInOverrideEdges: an override onto a disabled route's method
// passes, as that method would; one naming CONNECT or TRACE, which no
// route protects, passes as sent; blanks around the method, and a name
// that mixes '-' and '_', still name a protected method, which then needs
// a key.
func TestLockInOverrideEdges(t *testing.T) {
	t.Parallel()
	e := newEdgeRig(t, routesConfig(t, "routes:\n  - match: POST /off\n    disabled: true\n"))
	for i, tc := range []struct {
		req  string
		want int
	}{
		{post("GET", "/off", "", "{}", "X-HTTP-Method-Override", "POST"), http.StatusCreated},
		{post("GET", "/pay", "", "{}", "X-HTTP-Method-Override", "CONNECT"), http.StatusCreated},
		{post("GET", "/pay", "", "{}", "X-HTTP-Method", "TRACE"), http.StatusCreated},
		{post("GET", "/pay", "", "{}", "X-HTTP-Method-Override", "\tpost "), http.StatusBadRequest},
		{post("GET", "/pay", "", "{}", "x-method_override", "PATCH"), http.StatusBadRequest},
	} {
		if a := e.raw(t, tc.req, 1); len(a) != 1 || a[0].Status != tc.want {
			t.Fatalf("%d: %v; want %d", i, a, tc.want)
		}
	}
	if n := len(e.up.requests()); n != 3 {
		t.Fatalf("the upstream ran %d requests, want 3", n)
	}
}

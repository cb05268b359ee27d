package idemproxy_test

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
)

// connectJSON makes one Connect unary call in JSON with curl over
// HTTP/1.1, or with net/http's HTTP/1.1 client where curl is missing, and
// returns the status, headers and body.
func connectJSON(t *testing.T, addr, key, body string) (int, http.Header, string) {
	t.Helper()
	url := "http://" + addr + "/idem.test.v1.Payments/Charge"
	if curl, err := exec.LookPath("curl"); err == nil {
		out, err := exec.Command(curl, "-s", "-i", "--http1.1", "-X", "POST", url,
			"-H", "Content-Type: application/json", "-H", "Connect-Protocol-Version: 1", "-H", "Idempotency-Key: "+key,
			"--data-binary", body).Output()
		if err != nil {
			t.Fatalf("curl: %v", err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(out)), nil)
		if err != nil {
			t.Fatalf("curl's answer: %v\n%s", err, out)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("Idempotency-Key", key)
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// TestConnectFromCurl: Connect unary in JSON from curl, without
// descriptors (the fingerprint covers the JSON's bytes): a retry replays
// the answer, a key reused with another body is refused with Connect's
// JSON error.
func TestConnectFromCurl(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "")
	body := `{"account":"curl","amount":"3"}`
	s1, h1, b1 := connectJSON(t, env.addr, "curl-1", body)
	s2, h2, b2 := connectJSON(t, env.addr, "curl-1", body)
	if s1 != http.StatusOK || s2 != http.StatusOK || b1 != b2 || !strings.Contains(b1, `"run":"1"`) {
		t.Errorf("first %d %s, retry %d %s", s1, b1, s2, b2)
	}
	if h1.Get("Idempotent-Replayed") != "" || h2.Get("Idempotent-Replayed") != "true" || h2.Get("Trailer-X-Ledger") != h1.Get("Trailer-X-Ledger") || h1.Get("Trailer-X-Ledger") == "" {
		t.Errorf("headers: first %v, retry %v", h1, h2)
	}
	s3, _, b3 := connectJSON(t, env.addr, "curl-1", `{"account":"curl","amount":"4"}`)
	if s3 != http.StatusBadRequest || !strings.Contains(b3, `"code":"failed_precondition"`) || !strings.Contains(b3, "google.rpc.ErrorInfo") {
		t.Errorf("a reused key: %d %s", s3, b3)
	}
	if n := env.pay.runsOf("curl"); n != 1 {
		t.Errorf("the upstream ran %d times", n)
	}
}

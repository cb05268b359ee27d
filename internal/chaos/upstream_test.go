package chaos_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/chaos"
)

func post(url, key string, body []byte, timeout time.Duration) (*http.Response, []byte, error) {
	req, _ := http.NewRequest(http.MethodPost, url+"/payments", bytes.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Authorization", "Bearer a")
	resp, err := (&http.Client{Timeout: timeout}).Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// TestUpstreamFaults checks what each fault answers and records.
func TestUpstreamFaults(t *testing.T) {
	for _, tc := range []struct {
		fault     chaos.Fault
		status    int // 0: no answer
		effect    bool
		delivered bool
	}{
		{chaos.FaultNone, 201, true, true},
		{chaos.Fault500, 500, true, true},
		{chaos.Fault503, 503, false, true},
		{chaos.Fault429, 429, false, true},
		{chaos.FaultReset, 0, true, false},
		{chaos.FaultTruncate, 0, true, false},
		{chaos.FaultSlowBody, 0, true, false},
	} {
		t.Run(string(tc.fault), func(t *testing.T) {
			u := chaos.NewUpstream()
			srv := httptest.NewServer(u)
			defer srv.Close()
			u.SetMix(chaos.Mix{tc.fault: 1})
			// A slow body never ends: the client gives up on it.
			timeout := 10 * time.Second
			if tc.fault == chaos.FaultSlowBody {
				timeout = 300 * time.Millisecond
			}
			resp, body, err := post(srv.URL, "k", []byte("req"), timeout)
			switch {
			case tc.status == 0 && err == nil:
				t.Fatalf("got %d %q, want no complete answer", resp.StatusCode, body)
			case tc.status != 0 && err != nil:
				t.Fatal(err)
			}
			es := u.Executions()[chaos.ExecKey{Auth: "Bearer a", Path: "/payments", Key: "k"}]
			if len(es) != 1 {
				t.Fatalf("%d executions recorded, want 1", len(es))
			}
			e := es[0]
			if e.Fault != tc.fault || e.Effect != tc.effect || e.Delivered != tc.delivered || string(e.Body) != "req" {
				t.Fatalf("recorded %+v", e)
			}
			if tc.status != 0 {
				if resp.StatusCode != tc.status || !bytes.Equal(body, e.Answer) || resp.Header.Get(chaos.ExecHeader) != strconv.FormatInt(e.ID, 10) {
					t.Fatalf("answer %d %q (exec %s), recorded %d %q (exec %d)", resp.StatusCode, body, resp.Header.Get(chaos.ExecHeader), e.Status, e.Answer, e.ID)
				}
			}
		})
	}
}

// TestUpstreamCalmAnswersHanging checks that Calm answers a hanging request
// at once, and that answers are unique per execution.
func TestUpstreamCalmAnswersHanging(t *testing.T) {
	u := chaos.NewUpstream()
	srv := httptest.NewServer(u)
	defer srv.Close()
	u.SetMix(chaos.Mix{chaos.FaultHang: 1})
	type result struct {
		body []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		_, b, err := post(srv.URL, "k", []byte("req"), 10*time.Second)
		done <- result{b, err}
	}()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for u.Counts()[chaos.FaultHang] == 0 { // the request arrived and hangs
		<-tick.C
	}
	u.Calm()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	_, second, err := post(srv.URL, "k", []byte("req"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(r.body, second) {
		t.Fatalf("two executions answered alike: %q", second)
	}
	for _, e := range u.Executions()[chaos.ExecKey{Auth: "Bearer a", Path: "/payments", Key: "k"}] {
		if !e.Delivered {
			t.Fatalf("exec %d (%s) not delivered", e.ID, e.Fault)
		}
	}
}

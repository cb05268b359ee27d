package idemproxy

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func reviewRecord(key string) *idemstore.Record {
	return &idemstore.Record{
		Key:       idemstore.Key{Scope: "tenant", Operation: "POST /payments", Key: key},
		State:     idemstore.StateNeedsReview,
		Reason:    "upstream failed",
		Request:   &idemstore.Request{Method: "POST", Path: "/payments", Query: "a=1"},
		CreatedAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC),
	}
}

// testResolver is an HTTPResolver whose pauses are recorded, not slept.
func testResolver(url string) (*HTTPResolver, *[]time.Duration) {
	var pauses []time.Duration
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "calls"}, []string{"outcome"})
	r := &HTTPResolver{URL: url, Calls: calls, Logger: quiet, Timeout: 5 * time.Second, Backoff: 100 * time.Millisecond,
		sleep: func(ctx context.Context, d time.Duration) error { pauses = append(pauses, d); return ctx.Err() }}
	return r, &pauses
}

func TestHTTPResolverAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		answers []string // one per attempt: "STATUS BODY"
		verdict idem.Verdict
		wantErr string
		tries   int
		check   func(*testing.T, idem.Resolution)
	}{
		{name: "completed", answers: []string{`200 {"outcome":"completed","status":201,"headers":{"content-type":"application/json","Set-Cookie":"s=1","Date":"x"},"body":"{\"id\":1}","reason":"found\nby key"}`},
			verdict: idem.VerdictCompleted, tries: 1, check: func(t *testing.T, r idem.Resolution) {
				if r.Response.Status != 201 || string(r.Response.Body) != `{"id":1}` || r.Response.Header.Get("Content-Type") != "application/json" ||
					r.Response.Header.Get("Set-Cookie") != "" || r.Response.Header.Get("Date") != "" {
					t.Errorf("response %+v", r.Response)
				}
				if !strings.Contains(r.Reason, "completed with status 201 by the resolver") || !strings.Contains(r.Reason, "found by key") {
					t.Errorf("reason %q", r.Reason)
				}
			}},
		{name: "completed, body in base64", answers: []string{`200 {"outcome":"completed","status":200,"body_base64":"AP8="}`}, verdict: idem.VerdictCompleted, tries: 1,
			check: func(t *testing.T, r idem.Resolution) {
				if string(r.Response.Body) != "\x00\xff" {
					t.Errorf("body %q", r.Response.Body)
				}
			}},
		{name: "not found", answers: []string{`200 {"outcome":"not_found"}`}, verdict: idem.VerdictNotHappened, tries: 1},
		{name: "unknown", answers: []string{`200 {"outcome":"unknown"}`}, verdict: idem.VerdictUnknown, tries: 1},
		{name: "unknown fields are ignored", answers: []string{`200 {"outcome":"not_found","extra":[1,2]}`}, verdict: idem.VerdictNotHappened, tries: 1},
		{name: "not JSON", answers: []string{`200 <html>oops</html>`}, wantErr: "not the JSON expected", tries: 1},
		{name: "JSON of the wrong shape", answers: []string{`200 ["completed"]`}, wantErr: "not the JSON expected", tries: 1},
		{name: "an unknown outcome", answers: []string{`200 {"outcome":"maybe"}`}, wantErr: `outcome "maybe"`, tries: 1},
		{name: "no outcome", answers: []string{`200 {}`}, wantErr: `outcome ""`, tries: 1},
		{name: "completed without a status", answers: []string{`200 {"outcome":"completed"}`}, wantErr: "status 0", tries: 1},
		{name: "completed with a header that splits", answers: []string{`200 {"outcome":"completed","status":200,"headers":{"X-A":"a\r\nSet-Cookie: s=1"}}`}, wantErr: "control character", tries: 1},
		{name: "a 4xx is not retried", answers: []string{`404 no such route`}, wantErr: "404", tries: 1},
		{name: "a redirect is not followed", answers: []string{`302 elsewhere`}, wantErr: "302", tries: 1},
		{name: "a 5xx is retried", answers: []string{`500 down`, `200 {"outcome":"not_found"}`}, verdict: idem.VerdictNotHappened, tries: 2},
		{name: "429 is retried", answers: []string{`429 slow down`, `503 busy`, `200 {"outcome":"unknown"}`}, verdict: idem.VerdictUnknown, tries: 3},
		{name: "retries are bounded", answers: []string{`503 a`, `503 b`, `503 c`, `200 {"outcome":"not_found"}`}, wantErr: "attempt 3 of 3", tries: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var tries atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var q resolverQuestion
				if err := json.NewDecoder(r.Body).Decode(&q); err != nil || q.Key != "k1" || q.Method != "POST" || q.Path != "/payments" ||
					q.Query != "a=1" || q.Scope != "tenant" || q.Operation != "POST /payments" || r.Header.Get("Idempotency-Key") != "k1" {
					t.Errorf("the resolver was asked %+v (%v), key header %q", q, err, r.Header.Get("Idempotency-Key"))
				}
				a := tc.answers[min(int(tries.Add(1))-1, len(tc.answers)-1)]
				status, body, _ := strings.Cut(a, " ")
				if status == "302" {
					w.Header().Set("Location", "/elsewhere")
				}
				var code int
				json.Unmarshal([]byte(status), &code)
				w.WriteHeader(code)
				io.WriteString(w, body)
			}))
			defer srv.Close()
			r, pauses := testResolver(srv.URL)
			res, err := r.Resolve(context.Background(), reviewRecord("k1"))
			if n := int(tries.Load()); n != tc.tries {
				t.Errorf("%d attempts, want %d", n, tc.tries)
			}
			if len(*pauses) != tc.tries-1 || (len(*pauses) > 1 && (*pauses)[1] != 2*(*pauses)[0]) {
				t.Errorf("pauses %v after %d attempts", *pauses, tries.Load())
			}
			outcome := map[idem.Verdict]string{idem.VerdictCompleted: "completed", idem.VerdictNotHappened: "not_found", idem.VerdictUnknown: "unknown"}[tc.verdict]
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				outcome = "error"
			} else if err != nil || res.Verdict != tc.verdict {
				t.Fatalf("Resolve = %+v, %v; want verdict %v", res, err, tc.verdict)
			}
			if got := testutil.ToFloat64(r.Calls.WithLabelValues(outcome)); got != 1 {
				t.Errorf("idem_resolver_calls_total{outcome=%q} = %v, want 1", outcome, got)
			}
			if tc.check != nil {
				tc.check(t, res)
			}
		})
	}
}

// TestHTTPResolverHangs: a resolver that never answers costs each attempt
// its timeout, and the key stays in review.
func TestHTTPResolverHangs(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	r, _ := testResolver(srv.URL)
	var tries atomic.Int32
	r.Client = &http.Client{Transport: countingTransport{&tries}}
	r.Timeout, r.Attempts = 50*time.Millisecond, 2
	_, err := r.Resolve(context.Background(), reviewRecord("k1"))
	if !errors.Is(err, context.DeadlineExceeded) || tries.Load() != 2 {
		t.Fatalf("err = %v after %d attempts; want a deadline after 2", err, tries.Load())
	}
}

type countingTransport struct{ n *atomic.Int32 }

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return http.DefaultTransport.RoundTrip(r)
}

// TestHTTPResolverHugeAnswer: an answer over the cap is refused, not read
// whole.
func TestHTTPResolverHugeAnswer(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"outcome":"completed","status":200,"body":"`)
		chunk := strings.Repeat("x", 64<<10)
		for i := 0; i < (maxResolverAnswer/len(chunk))+2; i++ {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
		}
		io.WriteString(w, `"}`)
	}))
	defer srv.Close()
	r, _ := testResolver(srv.URL)
	if _, err := r.Resolve(context.Background(), reviewRecord("k1")); err == nil || !strings.Contains(err.Error(), "over") {
		t.Fatalf("err = %v, want the answer refused as too large", err)
	}
}

// TestHTTPResolverStopsWithContext: a resolver that keeps failing stops
// trying when the recovery's context ends.
func TestHTTPResolverStopsWithContext(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) }))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	r, _ := testResolver(srv.URL)
	r.Attempts = 100
	r.sleep = func(context.Context, time.Duration) error { cancel(); return ctx.Err() }
	if _, err := r.Resolve(ctx, reviewRecord("k1")); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

package idemclient_test

import (
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemclient"
)

// onlyReader hides the concrete reader, so http.NewRequest cannot set
// GetBody: the body can be sent once only.
type onlyReader struct{ io.Reader }

func TestTransportBodyWithoutGetBodyIsSentOnce(t *testing.T) {
	t.Parallel()
	s, srv := newScripted(t, drop)
	tr, ft := newTransport(t)
	req, _ := http.NewRequest("POST", srv.URL, onlyReader{strings.NewReader(`{"amount":500}`)})
	if req.GetBody != nil {
		t.Fatal("the request can replay its body")
	}
	_, err := (&http.Client{Transport: tr}).Do(req)
	if err == nil {
		t.Fatal("a dropped connection gave no error")
	}
	if keys := s.Keys(); len(keys) != 1 || keys[0] == "" || len(ft.Slept()) != 0 {
		t.Fatalf("sent %d times (keys %q), waits %v", len(keys), keys, ft.Slept())
	}
}

func TestTransportResendsBodyThroughGetBody(t *testing.T) {
	t.Parallel()
	s, srv := newScripted(t, drop, drop, status(201, "ok"))
	tr, _ := newTransport(t)
	req, _ := http.NewRequest("PATCH", srv.URL, strings.NewReader(`{"amount":500}`))
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if keys, bodies := s.Keys(), s.Bodies(); len(keys) != 3 || !allSame(keys) || slices.ContainsFunc(bodies, func(b string) bool { return b != `{"amount":500}` }) {
		t.Fatalf("keys %q, bodies %q", keys, bodies)
	}
}

// Each retryable answer is retried with the same key, after the server's
// Retry-After when it gives one and after the backoff otherwise.
func TestTransportRetriesWithBackoffAndRetryAfter(t *testing.T) {
	t.Parallel()
	s, srv := newScripted(t,
		status(429, "slow down", "Retry-After", "7"),
		status(503, "down"),
		status(502, "bad gateway"),
		// Another server's in-flight 409.
		status(409, `{"type":"about:blank","title":"in flight"}`, "Content-Type", "application/problem+json"),
		// A date: the fake clock starts at 03:04:05.
		status(504, "timeout", "Retry-After", "Fri, 02 Jan 2026 03:05:05 GMT"),
		status(201, "created"))
	tr, ft := newTransport(t)
	tr.MaxAttempts = 6
	tr.MaxElapsed = time.Hour
	resp, err := (&http.Client{Transport: tr}).Post(srv.URL, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || string(body) != "created" || idemclient.Replayed(resp) {
		t.Fatalf("answer %d %q", resp.StatusCode, body)
	}
	if keys := s.Keys(); len(keys) != 6 || !allSame(keys) || idemclient.KeyOf(resp) != keys[0] {
		t.Fatalf("keys %q, KeyOf %q", keys, idemclient.KeyOf(resp))
	}
	// 7s (Retry-After), then the backoff's bound doubling from 100ms (the
	// second wait is the second bound), then until the date, 60s after the
	// start less the 8.4s already waited.
	want := []time.Duration{7 * time.Second, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 60*time.Second - 8400*time.Millisecond}
	if got := ft.Slept(); !slices.Equal(got, want) {
		t.Fatalf("waits %v, want %v", got, want)
	}
}

func TestTransportBackoffIsCappedAndJittered(t *testing.T) {
	t.Parallel()
	_, srv := newScripted(t, status(503, ""))
	tr, ft := newTransport(t)
	tr.MaxAttempts, tr.MaxElapsed = 8, time.Hour
	tr.BaseDelay, tr.MaxDelay = time.Second, 5*time.Second
	var bounds []time.Duration
	idemclient.SetJitter(tr, func(bound time.Duration) time.Duration { bounds = append(bounds, bound); return bound / 2 })
	resp, err := (&http.Client{Transport: tr}).Post(srv.URL, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	wantBounds := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second, 5 * time.Second, 5 * time.Second}
	if !slices.Equal(bounds, wantBounds) {
		t.Fatalf("bounds %v, want %v", bounds, wantBounds)
	}
	for i, d := range ft.Slept() {
		if d != bounds[i]/2 {
			t.Fatalf("waits %v do not follow the jitter", ft.Slept())
		}
	}

	// The default jitter is random, within the bound.
	tr2 := &idemclient.Transport{MaxAttempts: 50, MaxElapsed: time.Hour, BaseDelay: 100 * time.Millisecond, MaxDelay: 100 * time.Millisecond}
	ft2 := &fakeTime{}
	idemclient.SetTime(tr2, ft2.Now, ft2.Sleep)
	resp, err = (&http.Client{Transport: tr2}).Post(srv.URL, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	waits := ft2.Slept()
	if len(waits) != 49 || slices.Max(waits) > 100*time.Millisecond || slices.Min(waits) < 0 || slices.Min(waits) == slices.Max(waits) {
		t.Fatalf("waits %v", waits)
	}
}

// When the attempts or the time run out, the last answer is returned: the
// response itself, a network error, or an *Error for a 409 still in flight.
func TestTransportGivesUp(t *testing.T) {
	t.Parallel()
	t.Run("attempts", func(t *testing.T) {
		t.Parallel()
		s, srv := newScripted(t, status(503, "still down"))
		tr, _ := newTransport(t)
		resp, err := (&http.Client{Transport: tr}).Post(srv.URL, "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || string(body) != "still down" || len(s.Keys()) != 4 {
			t.Fatalf("answer %d %q after %d attempts", resp.StatusCode, body, len(s.Keys()))
		}
	})
	t.Run("elapsed", func(t *testing.T) {
		t.Parallel()
		s, srv := newScripted(t, status(503, "", "Retry-After", "40"))
		tr, ft := newTransport(t)
		resp, err := (&http.Client{Transport: tr}).Post(srv.URL, "text/plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		// 40s fits the default minute; another 40s does not.
		if len(s.Keys()) != 2 || !slices.Equal(ft.Slept(), []time.Duration{40 * time.Second}) {
			t.Fatalf("%d attempts, waits %v", len(s.Keys()), ft.Slept())
		}
	})
	t.Run("huge retry-after", func(t *testing.T) {
		t.Parallel()
		s, srv := newScripted(t, status(429, "", "Retry-After", "99999999999999999999999"))
		tr, _ := newTransport(t)
		resp, err := (&http.Client{Transport: tr}).Post(srv.URL, "text/plain", nil)
		if err != nil || resp.StatusCode != 429 || len(s.Keys()) != 1 {
			t.Fatalf("%v, %v after %d attempts", resp, err, len(s.Keys()))
		}
		resp.Body.Close()
	})
	t.Run("network", func(t *testing.T) {
		t.Parallel()
		s, srv := newScripted(t, drop)
		tr, _ := newTransport(t)
		tr.MaxAttempts = 3
		_, err := (&http.Client{Transport: tr}).Post(srv.URL, "text/plain", nil)
		if err == nil || !strings.Contains(err.Error(), "3 attempts") || len(s.Keys()) != 3 || !allSame(s.Keys()) {
			t.Fatalf("%v after %d attempts", err, len(s.Keys()))
		}
	})
	t.Run("in flight", func(t *testing.T) {
		t.Parallel()
		inflight := status(409, `{"type":"`+idem.ProblemInFlight+`","title":"Request in progress","status":409}`,
			"Content-Type", "application/problem+json", "Idempotency-Outcome", "in_flight", "Retry-After", "2")
		s, srv := newScripted(t, inflight)
		tr, _ := newTransport(t)
		_, err := (&http.Client{Transport: tr}).Post(srv.URL, "text/plain", nil)
		var ie *idemclient.Error
		if !errors.As(err, &ie) || ie.Problem.Type != idem.ProblemInFlight || ie.RetryAfter != 2*time.Second || ie.Attempts != 4 || ie.Key != s.Keys()[0] || ie.NeedsReview() {
			t.Fatalf("err %v (%+v)", err, ie)
		}
	})
}

// A 409 that is a replayed answer, or idem's needs-review, is not retried,
// nor is a 400 or 422 of any kind; other answers pass through.
func TestTransportDoesNotRetryFinalAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		answer func(http.ResponseWriter, *http.Request)
		err    bool
	}{
		{"400 plain", status(400, "bad"), true},
		{"422 problem", status(422, `{"title":"Unprocessable","detail":"amount"}`, "Content-Type", "application/problem+json"), true},
		{"409 replayed", status(409, "conflict", "Idempotent-Replayed", "true"), true},
		{"409 needs review", status(409, `{"type":"`+idem.ProblemNeedsReview+`"}`, "Content-Type", "application/problem+json"), true},
		{"409 outcome", status(409, "", "Idempotency-Outcome", "needs_review"), true},
		{"503 replayed", status(503, "stored", "Idempotent-Replayed", "true"), false},
		{"500", status(500, "oops"), false},
		{"404", status(404, "no"), false},
		{"201", status(201, "yes"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, srv := newScripted(t, tc.answer)
			tr, _ := newTransport(t)
			resp, err := (&http.Client{Transport: tr}).Post(srv.URL, "text/plain", nil)
			if len(s.Keys()) != 1 {
				t.Fatalf("sent %d times", len(s.Keys()))
			}
			var ie *idemclient.Error
			if tc.err != errors.As(err, &ie) {
				t.Fatalf("got %v, %v", resp, err)
			}
			if resp != nil {
				resp.Body.Close()
			}
		})
	}
}

// bodyCounter wraps a RoundTripper and counts the response bodies closed.
type bodyCounter struct {
	base   http.RoundTripper
	opened atomic.Int32
	closed atomic.Int32
}

func (b *bodyCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := b.base.RoundTrip(r)
	if resp != nil {
		b.opened.Add(1)
		resp.Body = &countClose{ReadCloser: resp.Body, n: &b.closed}
	}
	return resp, err
}

type countClose struct {
	io.ReadCloser
	n    *atomic.Int32
	done bool
}

func (c *countClose) Close() error {
	if !c.done {
		c.done = true
		c.n.Add(1)
	}
	return c.ReadCloser.Close()
}

func TestTransportClosesBodiesItRetriesPast(t *testing.T) {
	t.Parallel()
	_, srv := newScripted(t, status(503, "a"), status(409, "b"), status(502, "c"), status(201, "d"))
	tr, _ := newTransport(t)
	bc := &bodyCounter{base: tr.Base}
	tr.Base = bc
	resp, err := (&http.Client{Transport: tr}).Post(srv.URL, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	if bc.opened.Load() != 4 || bc.closed.Load() != 3 {
		t.Fatalf("opened %d, closed %d before the caller's", bc.opened.Load(), bc.closed.Load())
	}
	resp.Body.Close()
}

func TestTransportKeys(t *testing.T) {
	t.Parallel()
	s, srv := newScripted(t, status(200, ""))
	tr, _ := newTransport(t)
	send := func(ctx context.Context, method string, header ...string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, method, srv.URL, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		before := req.Header.Clone()
		resp, err := tr.RoundTrip(req)
		if resp != nil {
			resp.Body.Close()
		}
		if !maps.EqualFunc(req.Header, before, slices.Equal) {
			t.Errorf("the caller's request was modified: %v, was %v", req.Header, before)
		}
		return resp, err
	}
	ctx := context.Background()
	last := func() string { k := s.Keys(); return k[len(k)-1] }

	// A new UUIDv7 per request.
	send(ctx, "POST")
	first := last()
	send(ctx, "POST")
	if first == last() || len(first) != 36 || first[14] != '7' {
		t.Fatalf("keys %q, %q", first, last())
	}
	// The caller's own header is kept, whatever the method.
	send(ctx, "POST", idem.HeaderName, `"quoted-key"`)
	if last() != `"quoted-key"` {
		t.Fatalf("key %q", last())
	}
	send(ctx, "PUT", idem.HeaderName, "put-key")
	if last() != "put-key" {
		t.Fatalf("key %q", last())
	}
	// A key from the context.
	kctx := idemclient.WithKey(ctx, "ctx-key")
	resp, _ := send(kctx, "PATCH")
	if last() != "ctx-key" || idemclient.KeyOf(resp) != "ctx-key" {
		t.Fatalf("key %q, KeyOf %q", last(), idemclient.KeyOf(resp))
	}
	// Other methods pass through without a key, even with one in the
	// context.
	resp, _ = send(kctx, "GET")
	if last() != "" || idemclient.KeyOf(resp) != "" {
		t.Fatalf("a GET carried %q", last())
	}
	// Methods and NewKey are configurable.
	tr.Methods = []string{"PUT"}
	tr.NewKey = func() string { return "made" }
	send(ctx, "PUT")
	if last() != "made" {
		t.Fatalf("key %q", last())
	}
	send(ctx, "POST")
	if last() != "" {
		t.Fatalf("an unprotected POST carried %q", last())
	}
	// Bad keys fail before anything is sent.
	n := len(s.Keys())
	if _, err := send(idemclient.WithKey(ctx, "has space"), "PUT"); err == nil {
		t.Fatal("a malformed context key was sent")
	}
	tr.NewKey = func() string { return "" }
	if _, err := send(ctx, "PUT"); err == nil {
		t.Fatal("an empty made key was sent")
	}
	if len(s.Keys()) != n {
		t.Fatal("a request with a bad key was sent")
	}
}

// A cancelled context ends a wait at once; a deadline too close for the
// wait returns the last answer without waiting.
func TestTransportHonoursTheContext(t *testing.T) {
	t.Parallel()
	t.Run("cancelled while waiting", func(t *testing.T) {
		t.Parallel()
		s, srv := newScripted(t, status(503, ""))
		tr, ft := newTransport(t)
		ctx, cancel := context.WithCancel(context.Background())
		ft.onSleep = func(ctx context.Context, n int, d time.Duration) error { cancel(); return ctx.Err() }
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, nil)
		_, err := tr.RoundTrip(req)
		if !errors.Is(err, context.Canceled) || len(s.Keys()) != 1 {
			t.Fatalf("%v after %d attempts", err, len(s.Keys()))
		}
	})
	t.Run("deadline", func(t *testing.T) {
		t.Parallel()
		s, srv := newScripted(t, status(503, "", "Retry-After", "30"))
		tr, ft := newTransport(t)
		// The context's deadline is on the real clock, 15s away: a 30s wait
		// would end past it.
		ft.now = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		if resp != nil {
			resp.Body.Close()
		}
		if len(s.Keys()) != 1 {
			t.Fatalf("%d attempts", len(s.Keys()))
		}
	})
}

// The zero Transport works: default base, methods and key.
func TestTransportZeroValue(t *testing.T) {
	t.Parallel()
	s, srv := newScripted(t, status(201, "ok"))
	resp, err := (&http.Client{Transport: &idemclient.Transport{}}).Post(srv.URL, "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 || idemclient.KeyOf(resp) == "" || s.Keys()[0] != idemclient.KeyOf(resp) {
		t.Fatalf("%d, key %q", resp.StatusCode, idemclient.KeyOf(resp))
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{" 12 ", 12 * time.Second, true},
		{"Fri, 02 Jan 2026 03:04:15 GMT", 10 * time.Second, true},
		{"Fri, 02 Jan 2026 03:00:00 GMT", 0, true}, // in the past
		{"99999999999999999999", 1<<63 - 1, true},
		{"9223372036", 9223372036 * time.Second, true},
		{"9223372037", 1<<63 - 1, true},
		{"-5", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
	} {
		got, ok := idemclient.RetryAfter(http.Header{"Retry-After": {tc.in}}, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Retry-After %q = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestErrorMessage(t *testing.T) {
	t.Parallel()
	e := &idemclient.Error{StatusCode: 422, Problem: idem.Problem{Title: "Idempotency-Key reused", Detail: "Use a new key."}}
	if got := e.Error(); got != "idemclient: 422 Idempotency-Key reused: Use a new key." {
		t.Fatalf("Error() = %q", got)
	}
	// A hostile problem document is kept as a body, not trusted as one.
	_, srv := newScripted(t, status(422, `{"type": 7, "title": ["x"]}`, "Content-Type", "application/problem+json"),
		status(400, strings.Repeat("x", 1<<20), "Content-Type", "application/problem+json"))
	tr, _ := newTransport(t)
	for range 2 {
		_, err := (&http.Client{Transport: tr}).Post(srv.URL, "text/plain", nil)
		var ie *idemclient.Error
		if !errors.As(err, &ie) || ie.Problem.Type != "" || ie.Problem.Title != http.StatusText(ie.StatusCode) || len(ie.Body) > 64<<10 {
			t.Fatalf("%v: %+v", err, ie.Problem)
		}
	}
}

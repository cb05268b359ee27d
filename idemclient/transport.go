package idemclient

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"time"

	"github.com/idem-dev/idem"
)

// Transport is an http.RoundTripper that makes requests safe to retry, in
// the style of oauth2.Transport: it wraps Base, and its zero value works.
//
// A request of a protected method (POST and PATCH by default) gets an
// Idempotency-Key, unless it already has one or its context carries one
// (WithKey); a request of any other method is protected only when it sets
// the header itself, and otherwise passes through untouched. A protected
// request is retried with the same key, and the same body, on a network
// error, a 409 in flight (after its Retry-After), a 429 or 503 (after
// Retry-After when the answer has one), and a 502 or 504, at most
// MaxAttempts times within MaxElapsed. Waits between attempts grow
// exponentially from BaseDelay to MaxDelay with full jitter (a random wait
// between zero and the bound), unless the server said how long with
// Retry-After; they end early, with the context's error, when the request's
// context does. A request whose body cannot be sent again (a non-empty Body
// and no GetBody; http.NewRequest sets GetBody for the usual readers) is
// sent once.
//
// The answer is returned as is, except 400, 422 and 409 answers other than
// "in flight", which come back as an *Error (see Error); when the attempts
// run out, the last answer (or network error) is returned. The caller's
// request is never modified: each attempt sends a clone.
//
// A redirected request (307, 308; http.Client sends it through the
// Transport again) keeps the key of the request it follows: a node that
// redirects a retry to another (a leader that stepped down, say) must not
// turn it into a new operation. A redirect that changes the method to GET
// (301, 302, 303) is a request of its own, unprotected.
type Transport struct {
	// Base sends each attempt. Defaults to http.DefaultTransport.
	Base http.RoundTripper

	// Methods are the protected methods. Defaults to POST and PATCH.
	Methods []string

	// NewKey makes the key of a request that has none. Defaults to NewKey
	// (a UUIDv7).
	NewKey func() string

	// MaxAttempts bounds how many times one request is sent, the first
	// included; 1 turns retries off. Defaults to 4.
	MaxAttempts int

	// MaxElapsed bounds the time from the first attempt after which no wait
	// begins: a retry whose wait would end past it is not made. Defaults to
	// one minute.
	MaxElapsed time.Duration

	// BaseDelay bounds the first wait; each later one doubles the bound.
	// Defaults to 100ms.
	BaseDelay time.Duration

	// MaxDelay caps the backoff's bound. A server's Retry-After is honoured
	// even when longer, within MaxElapsed. Defaults to 10s.
	MaxDelay time.Duration

	// Logger receives a debug record for each retry. Keys are never logged.
	// Defaults to slog.Default().
	Logger *slog.Logger

	// Test hooks: fake time and a deterministic jitter.
	now    func() time.Time
	sleep  func(ctx context.Context, d time.Duration) error
	jitter func(bound time.Duration) time.Duration
}

var _ http.RoundTripper = (*Transport)(nil)

func (t *Transport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return http.DefaultTransport
}

func (t *Transport) protects(method string) bool {
	if method == "" {
		method = http.MethodGet
	}
	if t.Methods == nil {
		return method == http.MethodPost || method == http.MethodPatch
	}
	return slices.Contains(t.Methods, method)
}

func (t *Transport) maxAttempts() int { return orDefault(t.MaxAttempts, 4) }
func (t *Transport) maxElapsed() time.Duration {
	return orDefault(t.MaxElapsed, time.Minute)
}

func orDefault[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

func (t *Transport) clock() time.Time {
	if t.now != nil {
		return t.now()
	}
	return time.Now()
}

func (t *Transport) logger() *slog.Logger {
	if t.Logger != nil {
		return t.Logger
	}
	return slog.Default()
}

// backoff is the wait before attempt n+1 (n ≥ 1): a random duration up to
// BaseDelay·2^(n-1), capped at MaxDelay.
func (t *Transport) backoff(n int) time.Duration {
	bound := orDefault(t.BaseDelay, 100*time.Millisecond)
	maxDelay := orDefault(t.MaxDelay, 10*time.Second)
	for i := 1; i < n && bound < maxDelay; i++ {
		bound *= 2
	}
	bound = min(bound, maxDelay)
	if t.jitter != nil {
		return t.jitter(bound)
	}
	return rand.N(bound + 1)
}

func (t *Transport) wait(ctx context.Context, d time.Duration) error {
	if t.sleep != nil {
		return t.sleep(ctx, d)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-timer.C:
		return nil
	}
}

// key returns the key req is sent with, and whether req is protected at all.
// set reports that the Transport adds the header.
func (t *Transport) key(req *http.Request) (key string, set, protected bool, err error) {
	if vs := req.Header.Values(idem.HeaderName); len(vs) > 0 {
		return vs[0], false, true, nil
	}
	if !t.protects(req.Method) {
		return "", false, false, nil
	}
	if k, ok := keyFromContext(req.Context()); ok {
		if err := idem.ValidateKey(k); err != nil {
			return "", false, false, fmt.Errorf("idemclient: the key from WithKey: %w", err)
		}
		return k, true, true, nil
	}
	// A redirect (307, 308) is the same operation sent elsewhere: http.Client
	// copies the caller's header, not the key this Transport added.
	if req.Response != nil && req.Response.Request != nil {
		if k := req.Response.Request.Header.Get(idem.HeaderName); k != "" {
			return k, true, true, nil
		}
	}
	if t.NewKey != nil {
		key = t.NewKey()
	} else {
		key = NewKey()
	}
	if err := idem.ValidateKey(key); err != nil {
		return "", false, false, fmt.Errorf("idemclient: Transport.NewKey: %w", err)
	}
	return key, true, true, nil
}

// RoundTrip sends req, retrying as the Transport's documentation says.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	key, set, protected, err := t.key(req)
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	if !protected {
		return t.base().RoundTrip(req)
	}
	ctx := req.Context()
	maxAttempts := t.maxAttempts()
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		maxAttempts = 1 // the body cannot be sent again
	}
	start := t.clock()
	for attempt := 1; ; attempt++ {
		r := req.Clone(ctx)
		if set {
			r.Header[idem.HeaderName] = []string{key}
		}
		if attempt > 1 && req.GetBody != nil {
			if r.Body, err = req.GetBody(); err != nil {
				return nil, fmt.Errorf("idemclient: getting the body again for attempt %d: %w", attempt, err)
			}
		}
		resp, err := t.base().RoundTrip(r)
		if resp != nil && resp.Request == nil {
			resp.Request = r
		}
		v := judge(resp, err)
		if v.final(ctx) || attempt >= maxAttempts {
			return t.answer(v, key, attempt)
		}
		delay, ok := v.serverWait(t.clock())
		if !ok {
			delay = t.backoff(attempt)
		}
		if !t.inBudget(ctx, start, delay) {
			return t.answer(v, key, attempt)
		}
		v.discard()
		t.logRetry(ctx, r, attempt, v, delay)
		if err := t.wait(ctx, delay); err != nil {
			return nil, fmt.Errorf("idemclient: waiting to retry: %w", err)
		}
	}
}

// inBudget reports whether a retry after delay ends within MaxElapsed and
// the context's deadline.
func (t *Transport) inBudget(ctx context.Context, start time.Time, delay time.Duration) bool {
	at := t.clock().Add(delay)
	if at.Sub(start) > t.maxElapsed() {
		return false
	}
	if dl, ok := ctx.Deadline(); ok && at.After(dl) {
		return false
	}
	return true
}

// answer is what RoundTrip returns for the attempt's verdict v.
func (t *Transport) answer(v verdict, key string, attempts int) (*http.Response, error) {
	switch {
	case v.err != nil && attempts > 1:
		return nil, fmt.Errorf("idemclient: %d attempts: %w", attempts, v.err)
	case v.err != nil:
		return nil, v.err
	case v.refused:
		return nil, newError(v.resp, v.body, key, attempts, t.clock())
	}
	return v.resp, nil
}

func (t *Transport) logRetry(ctx context.Context, r *http.Request, attempt int, v verdict, delay time.Duration) {
	l := t.logger()
	if !l.Enabled(ctx, slog.LevelDebug) {
		return
	}
	attrs := []slog.Attr{slog.String("method", r.Method), slog.String("host", r.URL.Host), slog.Int("attempt", attempt), slog.Duration("delay", delay)}
	if v.err != nil {
		attrs = append(attrs, slog.Any("error", v.err))
	} else {
		attrs = append(attrs, slog.Int("status", v.resp.StatusCode))
	}
	l.LogAttrs(ctx, slog.LevelDebug, "idemclient: retrying with the same key", attrs...)
}

// discard drains (a little) and closes the body of an answer retried past,
// so that its connection can be reused.
func (v verdict) discard() {
	if v.resp == nil {
		return
	}
	if v.body == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(v.resp.Body, maxErrorBody))
	}
	v.resp.Body.Close()
}

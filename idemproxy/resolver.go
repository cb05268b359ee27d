package idemproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemstore"
)

// HTTPResolver settles keys in review by asking a service over HTTP
// (--resolver-url): it POSTs what the key was for, and the service, which
// asks the outside system with the same idempotency key, says what became
// of it. docs/proxy.md describes the exchange.
//
// Each call is bounded: a timeout per attempt, a few attempts with a
// doubling pause between them for network errors, 429 and 5xx, and a cap
// on the answer's size. Any other failure (a 4xx, an answer that is not
// the JSON expected, an invalid stored answer) is an error, and the key
// stays in review for a person.
type HTTPResolver struct {
	// URL receives the POSTs. Required.
	URL string
	// Client sends them. Defaults to a client without redirects.
	Client *http.Client
	// Timeout bounds each attempt. Defaults to 10s.
	Timeout time.Duration
	// Attempts bounds the tries of one call. Defaults to 3.
	Attempts int
	// Backoff is the pause after the first failed attempt; it doubles
	// after each. Defaults to 500ms.
	Backoff time.Duration
	// Calls, if set, counts calls by outcome: completed, not_found,
	// unknown or error.
	Calls *prometheus.CounterVec
	// Logger defaults to slog.Default().
	Logger *slog.Logger

	// sleep pauses between attempts; tests replace it.
	sleep func(context.Context, time.Duration) error
}

// resolverQuestion is what the resolver is asked.
type resolverQuestion struct {
	Scope     string `json:"scope"`
	Operation string `json:"operation"`
	Key       string `json:"key"`
	Method    string `json:"method"`
	Path      string `json:"path"`
	// Host is the authority the operation names (host_aliases applied),
	// empty for a record of an earlier version, whose operation names
	// none: a resolver in front of an upstream that serves tenants by
	// host asks the tenant it names.
	Host      string    `json:"host,omitempty"`
	Query     string    `json:"query"`
	State     string    `json:"state"`
	Reason    string    `json:"reason"`
	CreatedAt time.Time `json:"created_at"`
}

// resolverAnswer is what it answers.
type resolverAnswer struct {
	// Outcome is completed, not_found or unknown.
	Outcome string `json:"outcome"`
	idemadmin.Answer
	// Reason, optional, is kept on a completed record.
	Reason string `json:"reason"`
}

// maxResolverAnswer bounds the resolver's answer: a stored body of
// idemadmin.MaxAnswerBody, escaped in JSON, and its headers.
const maxResolverAnswer = 4*idemadmin.MaxAnswerBody + 64<<10

// errNoRetry marks a resolver failure that another attempt would not fix.
var errNoRetry = errors.New("not retried")

// Resolve asks the service about rec.
func (r *HTTPResolver) Resolve(ctx context.Context, rec *idemstore.Record) (idem.Resolution, error) {
	res, err := r.resolve(ctx, rec)
	outcome := "error"
	if err == nil {
		outcome = map[idem.Verdict]string{idem.VerdictCompleted: "completed", idem.VerdictNotHappened: "not_found", idem.VerdictUnknown: "unknown"}[res.Verdict]
	}
	if r.Calls != nil {
		r.Calls.WithLabelValues(outcome).Inc()
	}
	log := r.Logger
	if log == nil {
		log = slog.Default()
	}
	// A line about a key in review: it names the key itself (see
	// idem.KeyDigest).
	attrs := []slog.Attr{slog.String("outcome", outcome), slog.String("scope", rec.Key.Scope),
		slog.String("operation", rec.Key.Operation), slog.String("key", rec.Key.Key), slog.String("key_digest", idem.KeyDigest(rec.Key))}
	if err != nil {
		log.LogAttrs(ctx, slog.LevelWarn, "resolver failed; the key stays in review", append(attrs, slog.Any("error", err))...)
	} else {
		log.LogAttrs(ctx, slog.LevelInfo, "resolver answered", attrs...)
	}
	return res, err
}

func (r *HTTPResolver) resolve(ctx context.Context, rec *idemstore.Record) (idem.Resolution, error) {
	q := resolverQuestion{Scope: rec.Key.Scope, Operation: rec.Key.Operation, Key: rec.Key.Key,
		State: string(rec.State), Reason: rec.Reason, CreatedAt: rec.CreatedAt.UTC()}
	q.Host = operationHost(rec.Key.Operation)
	if rec.Request != nil {
		q.Method, q.Path, q.Query = rec.Request.Method, rec.Request.Path, rec.Request.Query
	} else {
		q.Method, q.Path = splitOperation(rec.Key.Operation)
	}
	body, err := json.Marshal(q)
	if err != nil {
		return idem.Resolution{}, err
	}
	attempts, pause := r.Attempts, r.Backoff
	if attempts <= 0 {
		attempts = 3
	}
	if pause <= 0 {
		pause = 500 * time.Millisecond
	}
	sleep := r.sleep
	if sleep == nil {
		sleep = sleepCtx
	}
	for i := 1; ; i++ {
		ans, err := r.ask(ctx, rec.Key.Key, body)
		if err == nil {
			return ans.resolution(r.URL)
		}
		if errors.Is(err, errNoRetry) || i >= attempts || ctx.Err() != nil {
			return idem.Resolution{}, fmt.Errorf("resolver %s, attempt %d of %d: %w", redactURL(r.URL), i, attempts, err)
		}
		if err := sleep(ctx, pause); err != nil {
			return idem.Resolution{}, err
		}
		pause *= 2
	}
}

// ask makes one attempt.
func (r *HTTPResolver) ask(ctx context.Context, key string, body []byte) (*resolverAnswer, error) {
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoRetry, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("User-Agent", "idem-resolver")
	client := r.Client
	if client == nil {
		client = noRedirectClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResolverAnswer+1))
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	switch {
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return nil, fmt.Errorf("answered %s", resp.Status)
	case resp.StatusCode/100 != 2:
		return nil, fmt.Errorf("%w: answered %s: %s", errNoRetry, resp.Status, snippet(b))
	case len(b) > maxResolverAnswer:
		return nil, fmt.Errorf("%w: the answer is over %d bytes", errNoRetry, maxResolverAnswer)
	}
	var ans resolverAnswer
	if err := json.Unmarshal(b, &ans); err != nil {
		return nil, fmt.Errorf("%w: the answer is not the JSON expected (%v): %s", errNoRetry, err, snippet(b))
	}
	return &ans, nil
}

// resolution turns the answer into the engine's verdict.
func (a *resolverAnswer) resolution(from string) (idem.Resolution, error) {
	note := ""
	if a.Reason != "" {
		note = ": " + cutString(strings.Map(printableRune, a.Reason), 500)
	}
	switch a.Outcome {
	case "completed":
		resp, err := a.Answer.Response(true)
		if err != nil {
			return idem.Resolution{}, fmt.Errorf("resolver %s: outcome completed with an answer that cannot be stored: %w", redactURL(from), err)
		}
		return idem.Resolution{Verdict: idem.VerdictCompleted, Response: resp,
			Reason: fmt.Sprintf("completed with status %d by the resolver %s%s", resp.Status, redactURL(from), note)}, nil
	case "not_found":
		return idem.Resolution{Verdict: idem.VerdictNotHappened, Reason: "released by the resolver " + redactURL(from) + note}, nil
	case "unknown":
		return idem.Resolution{Verdict: idem.VerdictUnknown}, nil
	}
	return idem.Resolution{}, fmt.Errorf("resolver %s: outcome %q must be completed, not_found or unknown", redactURL(from), cutString(a.Outcome, 40))
}

var noRedirectClient = &http.Client{
	Transport:     http.DefaultTransport,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// sleepCtx pauses for d, or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// redactURL hides a password in u, for logs and reasons.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(invalid URL)"
	}
	return p.Redacted()
}

func snippet(b []byte) string {
	return cutString(strings.Map(printableRune, strings.TrimSpace(string(b))), 200)
}

func printableRune(r rune) rune {
	if r < ' ' || r == 0x7f {
		return ' '
	}
	return r
}

func cutString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xc0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}

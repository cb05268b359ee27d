package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
)

// Attempt is one request a client sent through a proxy and what came back.
type Attempt struct {
	// Op numbers the logical operation the attempt belongs to: one key and
	// body, sent again with the same key until the answer is final.
	Op     int64
	Client int
	Key    ExecKey
	// Probe marks a request with another body under a key that already got
	// an upstream's answer: it must never reach the upstream.
	Probe bool
	// Verify marks a request sent after recovery to check the key's final
	// state.
	Verify bool
	// Hangup marks an attempt the client gave up on early, on purpose: it
	// hung up while the proxy was still working.
	Hangup     bool
	Proxy      string
	Start, End time.Time
	Status     int
	Body       []byte
	Replayed   bool   // Idempotent-Replayed: true
	Outcome    string // Idempotency-Outcome
	Exec       int64  // ExecHeader, 0 when absent
	Problem    string // the problem document's type
	Err        string // transport error; Status is 0
}

// Final reports whether a client stops retrying on this answer: an
// upstream's answer, a replay, a mismatch or a key that needs review.
// Connection errors, 409 in flight, 429, 502, 503 and 504 are retried with
// the same key.
func (a *Attempt) Final() bool {
	switch {
	case a.Err != "":
		return false
	case a.Status == http.StatusConflict:
		return a.Problem != idem.ProblemInFlight
	case a.Status == http.StatusTooManyRequests, a.Status == http.StatusBadGateway,
		a.Status == http.StatusServiceUnavailable, a.Status == http.StatusGatewayTimeout:
		return false
	case a.Status >= 500 && a.Exec == 0:
		return false
	}
	return true
}

// String describes the attempt on one line.
func (a *Attempt) String() string {
	kind := ""
	switch {
	case a.Probe:
		kind = " probe"
	case a.Verify:
		kind = " verify"
	case a.Hangup:
		kind = " hangup"
	}
	head := fmt.Sprintf("%s op=%d client=%d%s via %s", a.Start.Format("15:04:05.000"), a.Op, a.Client, kind, a.Proxy)
	if a.Err != "" {
		return head + ": error: " + a.Err
	}
	s := fmt.Sprintf("%s: %d outcome=%s", head, a.Status, a.Outcome)
	if a.Replayed {
		s += " replayed"
	}
	if a.Exec != 0 {
		s += fmt.Sprintf(" exec=%d", a.Exec)
	}
	if a.Problem != "" {
		s += " problem=" + strings.TrimPrefix(a.Problem, idem.ProblemTypeBase)
	}
	return s + fmt.Sprintf(" (%s)", a.End.Sub(a.Start).Round(time.Millisecond))
}

// Load is the clients: goroutines that send POSTs with keys drawn from a
// small recent window per scope, so that duplicates and concurrent
// duplicates are common, each retried with its key until a final answer.
type Load struct {
	// Targets returns the proxies' current addresses; each attempt picks
	// one at random.
	Targets func() []string
	// Scopes are the Authorization values clients send ("" sends none: the
	// anonymous scope).
	Scopes []string
	// Path is the protected path. Defaults to /payments.
	Path string
	// Clients is how many goroutines send. Defaults to 8.
	Clients int
	// Rate bounds the attempts per second, all clients together. Defaults
	// to 100.
	Rate float64
	// Window is how many of a scope's most recent keys an operation draws
	// from. Defaults to 6.
	Window int
	// Fresh is the chance that an operation takes a new key. Defaults to
	// 0.3.
	Fresh float64
	// ProbeRate is the chance that an operation is a probe. Defaults to
	// 0.03.
	ProbeRate float64
	// HangupRate is the chance that a client hangs up on an attempt after
	// a random 10ms to 1.5s. Defaults to 0.03.
	HangupRate float64
	// MaxAttempts bounds the attempts of one operation. Defaults to 40.
	MaxAttempts int
	// Timeout bounds one attempt. Defaults to 15s.
	Timeout time.Duration

	client   *http.Client
	heads    []atomic.Int64
	ops      atomic.Int64
	mu       sync.Mutex
	attempts []Attempt
	answered map[ExecKey]bool
}

func (l *Load) init() {
	if l.Path == "" {
		l.Path = "/payments"
	}
	if l.Clients == 0 {
		l.Clients = 8
	}
	if l.Rate == 0 {
		l.Rate = 100
	}
	if l.Window == 0 {
		l.Window = 6
	}
	if l.Fresh == 0 {
		l.Fresh = 0.3
	}
	if l.ProbeRate == 0 {
		l.ProbeRate = 0.03
	}
	if l.HangupRate == 0 {
		l.HangupRate = 0.03
	}
	if l.MaxAttempts == 0 {
		l.MaxAttempts = 40
	}
	if l.Timeout == 0 {
		l.Timeout = 15 * time.Second
	}
	if len(l.Scopes) == 0 {
		l.Scopes = []string{""}
	}
	if l.client == nil {
		l.client = &http.Client{
			Timeout:   l.Timeout,
			Transport: &http.Transport{MaxIdleConnsPerHost: 32, DisableCompression: true, IdleConnTimeout: 30 * time.Second},
		}
		l.heads = make([]atomic.Int64, len(l.Scopes))
		l.answered = map[ExecKey]bool{}
	}
}

// Run sends until ctx ends, then returns once every client has.
func (l *Load) Run(ctx context.Context) {
	l.init()
	tokens := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Duration(float64(time.Second) / l.Rate))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				select {
				case tokens <- struct{}{}:
				default:
				}
			}
		}
	}()
	var wg sync.WaitGroup
	for c := range l.Clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				l.operation(ctx, c, tokens)
			}
		})
	}
	wg.Wait()
}

// operation picks a key and sends it until the answer is final, the
// attempts run out or ctx ends.
func (l *Load) operation(ctx context.Context, client int, tokens <-chan struct{}) {
	op := l.ops.Add(1)
	s := rand.IntN(len(l.Scopes))
	if rand.Float64() < l.ProbeRate {
		if key, ok := l.answeredKey(s); ok {
			if !take(ctx, tokens) {
				return
			}
			l.Send(ctx, op, client, key, ProbeBody(key), false)
			return
		}
	}
	var n int64
	if rand.Float64() < l.Fresh {
		n = l.heads[s].Add(1)
	} else {
		head := l.heads[s].Load()
		n = max(0, head-int64(rand.IntN(l.Window)))
	}
	key := ExecKey{Auth: l.Scopes[s], Path: l.Path, Key: fmt.Sprintf("k%06d", n)}
	body := BodyFor(key)
	for i := 0; i < l.MaxAttempts; i++ {
		if !take(ctx, tokens) {
			return
		}
		var a Attempt
		if rand.Float64() < l.HangupRate {
			actx, cancel := context.WithTimeout(ctx, 10*time.Millisecond+rand.N(1490*time.Millisecond))
			a = l.send(actx, op, client, key, body, false, true)
			cancel()
		} else {
			a = l.Send(ctx, op, client, key, body, false)
		}
		if a.Final() || ctx.Err() != nil {
			return
		}
		// Back off a little (pacing, not synchronisation): 10ms doubling
		// to 320ms, with jitter.
		d := time.Duration(10<<min(i, 5)) * time.Millisecond
		t := time.NewTimer(d/2 + rand.N(d/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func take(ctx context.Context, tokens <-chan struct{}) bool {
	select {
	case <-ctx.Done():
		return false
	case <-tokens:
		return true
	}
}

// answeredKey returns a key of scope s that already got an upstream's
// answer.
func (l *Load) answeredKey(s int) (ExecKey, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.answered { // map order is random enough
		if k.Auth == l.Scopes[s] {
			return k, true
		}
	}
	return ExecKey{}, false
}

// storedStatus reports whether idem serve keeps an upstream's answer of
// status for its key, so that a probe goes only to a key whose answer is
// stored. 429 and 503 (its default release_statuses) release the key, and
// other 5xx release it or send it to review: on a released key a request
// with another body rightly runs.
func storedStatus(status int) bool {
	return status < 500 && status != http.StatusTooManyRequests
}

// Send sends one POST with key and body to a random proxy and records the
// attempt.
func (l *Load) Send(ctx context.Context, op int64, client int, key ExecKey, body []byte, verify bool) Attempt {
	return l.send(ctx, op, client, key, body, verify, false)
}

func (l *Load) send(ctx context.Context, op int64, client int, key ExecKey, body []byte, verify, hangup bool) Attempt {
	l.init()
	targets := l.Targets()
	a := Attempt{Op: op, Client: client, Key: key, Verify: verify, Proxy: targets[rand.IntN(len(targets))], Start: time.Now()}
	a.Probe = !bytes.Equal(body, BodyFor(key))
	defer func() {
		a.End = time.Now()
		a.Hangup = hangup && a.Err != "" && ctx.Err() != nil
		l.mu.Lock()
		l.attempts = append(l.attempts, a)
		if a.Exec != 0 && !a.Probe && storedStatus(a.Status) {
			l.answered[key] = true
		}
		l.mu.Unlock()
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+a.Proxy+key.Path, bytes.NewReader(body))
	if err != nil {
		a.Err = err.Error()
		return a
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key.Key)
	if key.Auth != "" {
		req.Header.Set("Authorization", key.Auth)
	}
	resp, err := l.client.Do(req)
	if err != nil {
		a.Err = err.Error()
		return a
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		// A body cut short is no answer: the client retries.
		a.Err = fmt.Sprintf("%d, body cut short after %d bytes: %v", resp.StatusCode, len(b), err)
		return a
	}
	a.Status, a.Body = resp.StatusCode, b
	a.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	a.Outcome = resp.Header.Get("Idempotency-Outcome")
	if v := resp.Header.Get(ExecHeader); v != "" {
		a.Exec, _ = strconv.ParseInt(v, 10, 64)
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		var p struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(b, &p) == nil {
			a.Problem = p.Type
		}
	}
	return a
}

// Attempts returns a copy of every attempt so far.
func (l *Load) Attempts() []Attempt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Attempt(nil), l.attempts...)
}

// Close closes the clients' idle connections.
func (l *Load) Close() {
	if l.client != nil {
		l.client.CloseIdleConnections()
	}
}

// BodyFor is the one request body every operation with key sends.
func BodyFor(key ExecKey) []byte {
	return fmt.Appendf(nil, `{"amount":%d,"currency":"EUR","reference":%q}`, amount(key), key.Key)
}

// ProbeBody is a body that differs from BodyFor(key) in meaning.
func ProbeBody(key ExecKey) []byte {
	return fmt.Appendf(nil, `{"amount":%d,"currency":"EUR","reference":%q}`, amount(key)+1, key.Key)
}

func amount(key ExecKey) int {
	h := fnv.New32a()
	h.Write([]byte(key.Auth + "\x00" + key.Key))
	return int(h.Sum32()%100000) + 1
}

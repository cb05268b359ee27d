package chaos

import (
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Fault is what the chaotic upstream does with one request.
type Fault string

// The upstream's faults. Every one but Fault503 and Fault429 records an
// execution with an effect before it acts: the work is done whatever the
// proxy hears afterwards.
const (
	// FaultNone does the work and answers 201.
	FaultNone Fault = "ok"
	// FaultStall does the work, waits (possibly past the proxy's lease, so
	// that only heartbeats keep it), and answers 201.
	FaultStall Fault = "stall"
	// FaultHang does the work and answers only when the proxy gives up (its
	// upstream timeout) or the faults stop.
	FaultHang Fault = "hang"
	// FaultReset does the work and resets the connection without answering:
	// the outcome is ambiguous to the proxy.
	FaultReset Fault = "reset"
	// FaultTruncate does the work and answers 201 with its body cut short.
	FaultTruncate Fault = "truncate"
	// FaultSlowBody does the work, sends the headers and half the body, and
	// sends the rest only when the proxy gives up (its upstream deadline)
	// or the faults stop.
	FaultSlowBody Fault = "slow_body"
	// Fault500 does the work and answers 500, which the proxy stores.
	Fault500 Fault = "500"
	// Fault503 does nothing and answers 503 (the proxy releases the key).
	Fault503 Fault = "503"
	// Fault429 does nothing and answers 429 (the proxy releases the key).
	Fault429 Fault = "429"
)

// Faults lists every fault, FaultNone first.
func Faults() []Fault {
	return []Fault{FaultNone, FaultStall, FaultHang, FaultReset, FaultTruncate, FaultSlowBody, Fault500, Fault503, Fault429}
}

// Mix weighs the faults the upstream draws from for each request. Missing
// faults weigh nothing; an empty mix always answers normally.
type Mix map[Fault]int

// ExecHeader is the response header that names the execution an answer
// came from, so a client can tell an upstream's answer from a proxy's.
const ExecHeader = "X-Chaos-Exec"

// ExecKey identifies the executions of one idempotency key as the upstream
// sees them: the scope header's raw value, the path and the key.
type ExecKey struct {
	Auth, Path, Key string
}

// Exec is one request the upstream received.
type Exec struct {
	ID    int64
	Key   ExecKey
	Body  []byte // the request body
	Fault Fault
	// Effect is whether the upstream did the work: true for every fault but
	// 503 and 429, which tell the proxy that nothing happened.
	Effect bool
	// Status and Answer are the answer this execution gives (or would have
	// given, for reset and truncate): unique per execution.
	Status int
	Answer []byte
	// Delivered is whether the whole answer was handed to the connection.
	// False for reset and truncate, and for a stall, hang or slow body the
	// proxy gave up on: no proxy can have stored it.
	Delivered  bool
	Start, End time.Time
}

// Upstream is a chaotic HTTP API: it records every request per key with its
// body, answers each with a body unique to that execution, and draws a
// fault per request from its mix.
type Upstream struct {
	// StallMin and StallMax bound a FaultStall's wait. HangMax bounds a
	// FaultHang or FaultSlowBody that nobody gives up on.
	StallMin, StallMax, HangMax time.Duration
	// MaxPad is the most padding bytes added to an answer, so that some
	// answers span several reads and packets.
	MaxPad int

	mix    atomic.Pointer[weighted]
	nextID atomic.Int64

	mu     sync.Mutex
	execs  map[ExecKey][]*Exec
	byID   map[int64]*Exec
	counts map[Fault]int64
	calm   chan struct{}
	calmed bool
}

// NewUpstream returns an upstream that answers normally until SetMix.
func NewUpstream() *Upstream {
	u := &Upstream{
		StallMin: 500 * time.Millisecond, StallMax: 3 * time.Second, HangMax: 30 * time.Second, MaxPad: 4096,
		execs: map[ExecKey][]*Exec{}, byID: map[int64]*Exec{}, counts: map[Fault]int64{}, calm: make(chan struct{}),
	}
	u.mix.Store(&weighted{})
	return u
}

// SetMix makes the upstream draw each request's fault from m.
func (u *Upstream) SetMix(m Mix) { u.mix.Store(newWeighted(m)) }

// Calm ends the faults: later requests are answered normally, and stalled
// or hanging ones are answered at once.
func (u *Upstream) Calm() {
	u.mix.Store(&weighted{})
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.calmed {
		u.calmed = true
		close(u.calm)
	}
}

// Executions returns a copy of every request received, per key, in the
// order they arrived.
func (u *Upstream) Executions() map[ExecKey][]Exec {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make(map[ExecKey][]Exec, len(u.execs))
	for k, es := range u.execs {
		cp := make([]Exec, len(es))
		for i, e := range es {
			cp[i] = *e
		}
		out[k] = cp
	}
	return out
}

// Exec returns the execution with the given id.
func (u *Upstream) Exec(id int64) (Exec, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	e, ok := u.byID[id]
	if !ok {
		return Exec{}, false
	}
	return *e, true
}

// Counts returns how many requests drew each fault.
func (u *Upstream) Counts() map[Fault]int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make(map[Fault]int64, len(u.counts))
	for f, n := range u.counts {
		out[f] = n
	}
	return out
}

// ServeHTTP records the request and acts out its fault.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		// The request never arrived whole: no work, no execution.
		http.Error(w, "unreadable body", http.StatusBadRequest)
		return
	}
	fault := u.mix.Load().draw()
	e := &Exec{
		ID:    u.nextID.Add(1),
		Key:   ExecKey{Auth: r.Header.Get("Authorization"), Path: r.URL.Path, Key: r.Header.Get("Idempotency-Key")},
		Body:  body,
		Fault: fault,
		Start: time.Now(),
	}
	e.Effect = fault != Fault503 && fault != Fault429
	e.Status = http.StatusCreated
	switch fault {
	case Fault500, Fault503, Fault429:
		e.Status, _ = strconv.Atoi(string(fault))
	}
	e.Answer = u.answer(e)
	u.mu.Lock()
	u.execs[e.Key] = append(u.execs[e.Key], e)
	u.byID[e.ID] = e
	u.counts[fault]++
	calm := u.calm
	u.mu.Unlock()

	delivered := false
	defer func() {
		u.mu.Lock()
		e.Delivered, e.End = delivered, time.Now()
		u.mu.Unlock()
	}()
	switch fault {
	case FaultReset:
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				reset(conn)
				return
			}
		}
		panic(http.ErrAbortHandler)
	case FaultTruncate:
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(e.Answer)))
		w.Header().Set(ExecHeader, strconv.FormatInt(e.ID, 10))
		w.WriteHeader(e.Status)
		_, _ = w.Write(e.Answer[:len(e.Answer)/2])
		_ = http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	case FaultSlowBody:
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(e.Answer)))
		w.Header().Set(ExecHeader, strconv.FormatInt(e.ID, 10))
		w.WriteHeader(e.Status)
		half := len(e.Answer) / 2
		_, _ = w.Write(e.Answer[:half])
		_ = http.NewResponseController(w).Flush()
		if !wait(r, calm, u.HangMax) {
			return
		}
		_, err = w.Write(e.Answer[half:])
		delivered = err == nil
		return
	case FaultStall:
		d := u.StallMin
		if u.StallMax > u.StallMin {
			d += rand.N(u.StallMax - u.StallMin)
		}
		if !wait(r, calm, d) {
			return
		}
	case FaultHang:
		if !wait(r, calm, u.HangMax) {
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(ExecHeader, strconv.FormatInt(e.ID, 10))
	w.WriteHeader(e.Status)
	_, err = w.Write(e.Answer)
	delivered = err == nil
}

// wait pauses a stalled answer for d, or until the faults stop; it reports
// false when the proxy gave up first.
func wait(r *http.Request, calm <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-calm:
		return true
	case <-r.Context().Done():
		return false
	}
}

// answer is e's answer body: JSON naming the execution, with a random nonce
// and padding, so no two executions answer alike.
func (u *Upstream) answer(e *Exec) []byte {
	var nonce [8]byte
	_, _ = crand.Read(nonce[:])
	pad := 0
	if u.MaxPad > 0 {
		pad = rand.IntN(u.MaxPad + 1)
	}
	b, _ := json.Marshal(struct {
		Exec   int64  `json:"exec"`
		Key    string `json:"key"`
		Status int    `json:"status"`
		Fault  Fault  `json:"fault"`
		Nonce  string `json:"nonce"`
		Pad    string `json:"pad,omitempty"`
	}{e.ID, e.Key.Key, e.Status, e.Fault, hex.EncodeToString(nonce[:]), padding(pad)})
	return b
}

func padding(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[rand.IntN(len(alphabet))]
	}
	return string(b)
}

// weighted draws faults by weight.
type weighted struct {
	faults []Fault
	cum    []int
}

func newWeighted(m Mix) *weighted {
	w := &weighted{}
	total := 0
	for _, f := range Faults() {
		if n := m[f]; n > 0 {
			total += n
			w.faults = append(w.faults, f)
			w.cum = append(w.cum, total)
		}
	}
	return w
}

func (w *weighted) draw() Fault {
	if len(w.faults) == 0 {
		return FaultNone
	}
	n := rand.IntN(w.cum[len(w.cum)-1])
	for i, c := range w.cum {
		if n < c {
			return w.faults[i]
		}
	}
	return FaultNone
}

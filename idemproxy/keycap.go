package idemproxy

import (
	"container/list"
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/idem-dev/idem"
)

// NewKeyLimit caps the new keys each scope (each client: see ScopeHeader)
// may reserve in an interval, so that one client cannot fill the store.
// Only a new key counts, when the proxy reserves it: a retry that replays a
// stored answer, waits for one in flight or is refused as a mismatch
// reaches no reservation, and is never refused by the cap. A request over
// the cap gets 429 (problem type too-many-new-keys) with Retry-After, its
// fresh reservation is released before anything is forwarded, and it does
// not count; a retry with the same key after Retry-After is forwarded. A
// key released unrun (its request never reached the upstream, or the
// upstream refused it before it had the body) is given back to the count;
// one released after the upstream had it counts again when retried.
//
// Each scope's interval starts with its first new key and lasts Interval;
// the next new key after it starts another. Counts are kept in this
// process's memory, for at most MaxCappedScopes scopes per cap (the scopes
// whose interval started longest ago make room), and start afresh when the
// configuration is reloaded; a fleet of n instances lets a scope reserve up
// to n times Limit.
//
// In YAML it is a mapping, {limit: 100, interval: 1m}, or the string
// "100/1m" that --new-keys-per-scope takes.
type NewKeyLimit struct {
	// Limit is the most new keys one scope may reserve per Interval. 0
	// turns the cap off, on a route: off for that route whatever the
	// global setting. Defaults to 0: no cap.
	Limit int `yaml:"limit"`
	// Interval is the length of each scope's interval; at least a
	// second. Defaults to 1m.
	Interval Duration `yaml:"interval"`
}

// MaxCappedScopes is the most scopes one new-key cap counts at once
// (about 150 bytes each).
const MaxCappedScopes = 100_000

// DefaultNewKeyInterval is NewKeyLimit.Interval's default.
const DefaultNewKeyInterval = time.Minute

// ParseNewKeyLimit parses LIMIT/INTERVAL ("100/1m"), or LIMIT alone (per
// DefaultNewKeyInterval); "0" or "off" turn the cap off.
func ParseNewKeyLimit(s string) (NewKeyLimit, error) {
	if s == "off" {
		return NewKeyLimit{}, nil
	}
	n, iv, hasIV := strings.Cut(s, "/")
	limit, err := strconv.Atoi(n)
	if err != nil {
		return NewKeyLimit{}, fmt.Errorf("new_keys_per_scope %q must be LIMIT/INTERVAL, such as 100/1m", s)
	}
	l := NewKeyLimit{Limit: limit}
	if hasIV {
		d, err := time.ParseDuration(iv)
		if err != nil {
			return NewKeyLimit{}, fmt.Errorf("new_keys_per_scope %q: %q is not a duration (use e.g. 1m, 1h)", s, iv)
		}
		l.Interval = Duration(d)
	}
	return l, l.check()
}

// UnmarshalYAML reads {limit: N, interval: D} or "N/D".
func (l *NewKeyLimit) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		v, err := ParseNewKeyLimit(n.Value)
		if err != nil {
			return fmt.Errorf("line %d: %v", n.Line, err)
		}
		*l = v
		return nil
	case yaml.MappingNode:
		type plain NewKeyLimit
		var v plain
		if err := n.Decode(&v); err != nil {
			return err
		}
		for i := 0; i < len(n.Content); i += 2 {
			if k := n.Content[i].Value; k != "limit" && k != "interval" {
				return fmt.Errorf("line %d: new_keys_per_scope has limit and interval, not %q", n.Content[i].Line, k)
			}
		}
		if err := NewKeyLimit(v).check(); err != nil {
			return fmt.Errorf("line %d: %v", n.Line, err)
		}
		*l = NewKeyLimit(v)
		return nil
	}
	return fmt.Errorf("line %d: new_keys_per_scope is {limit: N, interval: D} or \"N/D\"", n.Line)
}

// check reports a limit the proxy cannot start with.
func (l NewKeyLimit) check() error {
	switch {
	case l.Limit < 0:
		return fmt.Errorf("new_keys_per_scope: limit %d is negative", l.Limit)
	case l.Interval < 0 || (l.Interval > 0 && l.Interval.d() < time.Second):
		return fmt.Errorf("new_keys_per_scope: interval %v must be at least a second", l.Interval)
	}
	return nil
}

// String formats l as ParseNewKeyLimit reads it.
func (l NewKeyLimit) String() string {
	if l.Limit == 0 {
		return "off"
	}
	return strconv.Itoa(l.Limit) + "/" + l.interval().String()
}

func (l NewKeyLimit) interval() time.Duration {
	if l.Interval == 0 {
		return DefaultNewKeyInterval
	}
	return l.Interval.d()
}

// keyCap counts the new keys of each scope in its current interval. It
// keeps a digest of each scope (maphash, seeded per process), never the
// scope, and at most max of them, oldest interval first out.
type keyCap struct {
	limit    int
	interval time.Duration
	max      int
	now      func() time.Time
	seed     maphash.Seed

	mu      sync.Mutex
	byScope map[uint64]*list.Element // of *capWindow
	order   list.List                // by start: the oldest first
	full    bool                     // logged that the table is full
}

type capWindow struct {
	scope  uint64
	start  time.Time
	n      int
	warned bool // the first refusal of this window was logged
}

func newKeyCap(l NewKeyLimit, now func() time.Time) *keyCap {
	if l.Limit == 0 {
		return nil
	}
	return &keyCap{limit: l.Limit, interval: l.interval(), max: MaxCappedScopes, now: now,
		seed: maphash.MakeSeed(), byScope: map[uint64]*list.Element{}}
}

// admit counts a new key of scope, and returns the window it was counted
// in (for refund), or, over the cap, refuses it (nil) and says how long
// until the scope's interval ends, and whether this is the interval's
// first refusal (the one to log). full is set when room was made by
// forgetting a scope's count for the first time.
func (c *keyCap) admit(scope string) (counted *capWindow, wait time.Duration, first, full bool) {
	h := maphash.String(c.seed, scope)
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	// Intervals that ended are forgotten: a scope without one starts
	// afresh.
	for e := c.order.Front(); e != nil; e = c.order.Front() {
		w := e.Value.(*capWindow)
		if now.Sub(w.start) < c.interval {
			break
		}
		c.order.Remove(e)
		delete(c.byScope, w.scope)
	}
	if e := c.byScope[h]; e != nil {
		w := e.Value.(*capWindow)
		if w.n < c.limit {
			w.n++
			return w, 0, false, false
		}
		first, w.warned = !w.warned, true
		// At most an interval, whatever a clock without a monotonic
		// reading did.
		return nil, min(w.start.Add(c.interval).Sub(now), c.interval), first, false
	}
	for len(c.byScope) >= c.max {
		e := c.order.Front()
		delete(c.byScope, e.Value.(*capWindow).scope)
		c.order.Remove(e)
		if !c.full {
			c.full, full = true, true
		}
	}
	w := &capWindow{scope: h, start: now, n: 1}
	c.byScope[h] = c.order.PushBack(w)
	return w, 0, false, full
}

// refund gives back a key counted in w whose reservation was released
// without the upstream running it (nothing was sent, or the upstream
// refused the request before it had its body): it holds nothing in the
// store, so a retry with it is not another new key. A window that ended or
// was forgotten meanwhile is left alone: the next interval owes nothing.
func (c *keyCap) refund(w *capWindow) {
	if w == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.byScope[w.scope]; e != nil && e.Value.(*capWindow) == w && w.n > 0 {
		w.n--
	}
}

// scopes returns how many scopes are counted.
func (c *keyCap) scopes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byScope)
}

// routeCap is a route's use of a cap: the cap may be shared with other
// routes (the global setting), the metric is the route's.
type routeCap struct {
	cap     *keyCap
	route   string
	refused prometheus.Counter // nil without metrics
}

// capsOf returns the caps of cfg: one for the global setting, shared by
// the routes that do not set their own, and one for each route that does
// (nil where off).
func capsOf(cfg Config, now func() time.Time) (global *keyCap, byRoute []*keyCap) {
	if cfg.NewKeysPerScope != nil {
		global = newKeyCap(*cfg.NewKeysPerScope, now)
	}
	byRoute = make([]*keyCap, len(cfg.Routes))
	for i, r := range cfg.Routes {
		if r.NewKeysPerScope == nil {
			byRoute[i] = global
		} else {
			byRoute[i] = newKeyCap(*r.NewKeysPerScope, now)
		}
	}
	return global, byRoute
}

// routeCap returns label's use of c, or nil when c is nil.
func (p *Proxy) routeCap(c *keyCap, label string) *routeCap {
	if c == nil {
		return nil
	}
	rc := &routeCap{cap: c, route: label}
	if p.metrics != nil {
		rc.refused = p.metrics.newKeysRefused.WithLabelValues(label)
	}
	return rc
}

// overCap reports whether lease, a key the proxy has just reserved, is
// over its scope's cap; if so it releases the key and answers the request.
// Otherwise it returns the window the key was counted in (nil without a
// cap), for a refund should the key be released unrun.
func (f *forwarder) overCap(w http.ResponseWriter, r *http.Request, lease *idem.Lease) (over bool, counted *capWindow) {
	rc := f.cap
	if rc == nil {
		return false, nil
	}
	k := lease.Key()
	counted, wait, first, full := rc.cap.admit(k.Scope)
	if full {
		f.p.log.LogAttrs(r.Context(), slog.LevelWarn, "new_keys_per_scope counts as many scopes as it may; the scopes whose interval started longest ago are forgotten, and start afresh",
			slog.String("route", rc.route), slog.Int("scopes", MaxCappedScopes))
	}
	if counted != nil {
		return false, counted
	}
	s := idem.SituationTooManyNewKeys
	settlement := f.settle(r.Context(), lease, true, "")
	secs := int((wait + time.Second - 1) / time.Second)
	detail := fmt.Sprintf("This client has reserved the %d new keys per %v the proxy allows it, so this request was not forwarded and its key was not kept. Retry with the same key after %d seconds.",
		rc.cap.limit, rc.cap.interval, secs)
	if settlement == settledFailed {
		detail = fmt.Sprintf("This client has reserved the %d new keys per %v the proxy allows it, so this request was not forwarded, but its key could not be released: retries get 409 until the key is settled.",
			rc.cap.limit, rc.cap.interval)
	}
	if rc.refused != nil {
		rc.refused.Inc()
	}
	if first {
		f.p.log.LogAttrs(context.WithoutCancel(r.Context()), slog.LevelWarn, "new key refused: the scope reached its new_keys_per_scope; refusing its new keys until its interval ends",
			slog.String("route", rc.route), slog.String("scope", k.Scope), slog.String("key_digest", idem.KeyDigest(k)),
			slog.Int("limit", rc.cap.limit), slog.Duration("interval", rc.cap.interval), slog.Duration("retry_after", wait))
	}
	f.p.count(f.label, s, settlement)
	w.Header().Set("Retry-After", strconv.Itoa(max(secs, 1)))
	f.p.writeProblem(w, s, detail, k.Key)
	return true, nil
}

// refund gives back the count of a key released unrun (see keyCap.refund).
func (f *forwarder) refund(counted *capWindow) {
	if f.cap != nil {
		f.cap.cap.refund(counted)
	}
}

package chaos

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idem-dev/idem/idemstore"
)

// Scenario is one chaos run against one store: a chaotic upstream, several
// `idem serve` processes sharing the store (through a Relay when there is
// one), clients with repeating keys, and a schedule of faults; then calm,
// recovery, a verification pass and the checks of Check.
type Scenario struct {
	// Name names the store in reports.
	Name string
	// Bin is the idem binary (see Build).
	Bin string
	// Dir receives the proxies' configuration and logs.
	Dir string
	// StoreURL is the store URL the proxies use (the relay's address in it
	// when there is a relay).
	StoreURL string
	// Inspect reads the store directly, past the relay, for the checks.
	Inspect idemstore.Store
	// Relay, if set, sits between the proxies and the store and injects
	// network faults. DropPatterns choose the statements whose replies it
	// drops (upper case; besides, a third of the drops hit any statement).
	Relay        *Relay
	DropPatterns [][]byte
	// Duration is the fault phase. Defaults to 20s.
	Duration time.Duration
	// Proxies is how many `idem serve` processes share the store. Defaults
	// to 3.
	Proxies int
	// Lease, RecoverInterval, UpstreamTimeout (for the answer's headers)
	// and UpstreamDeadline (for the whole call) configure the proxies.
	// Default to 2s, 1s, 3s and 5s.
	Lease, RecoverInterval, UpstreamTimeout, UpstreamDeadline time.Duration
	// UpstreamIdle is how long the upstream keeps an idle keep-alive
	// connection: far shorter than the proxies keep theirs, so that a
	// proxy often sends on a connection the upstream is closing. Defaults
	// to 200ms.
	UpstreamIdle time.Duration
	// Ambiguous is the proxies' policy for an upstream that failed after
	// the request was sent. Defaults to escalate; release breaks the
	// at-most-once guarantee on this upstream, which tests of the checks
	// use.
	Ambiguous string
	// ExtraArgs are added to every proxy's command line.
	ExtraArgs []string
	// Clients and Rate size the load (see Load). Default to 8 and 120/s.
	Clients int
	Rate    float64
	// Mix is the upstream's faults during the fault phase. Defaults to
	// DefaultMix.
	Mix Mix
	// FaultEvery is the fault schedule's tick. Defaults to 250ms.
	FaultEvery time.Duration
	// Settle bounds recovery (no record left pending). Defaults to 60s.
	Settle time.Duration
	// Logf, if set, receives progress lines.
	Logf func(format string, args ...any)
}

// DefaultMix is the upstream's faults during the fault phase: most
// requests answer normally.
var DefaultMix = Mix{
	FaultNone: 60, FaultStall: 6, FaultHang: 3, FaultReset: 6, FaultTruncate: 3,
	FaultSlowBody: 3, Fault500: 6, Fault503: 6, Fault429: 7,
}

// Outcome is the result of a scenario.
type Outcome struct {
	Report *Report
	// Faults counts the faults injected, by "where/kind". The connections
	// an outage refused are not counted: they follow from the outage.
	Faults map[string]int64
	// Recovery is how long the store took, after the faults stopped, to
	// hold no pending record.
	Recovery time.Duration
	// Alarms are race reports, panics and fatal errors the proxies printed.
	Alarms []string
	// Procs are the proxies, for their logs.
	Procs []*Proc
}

// FaultLine lists the faults injected, sorted by name.
func (o *Outcome) FaultLine() string {
	var b strings.Builder
	total := int64(0)
	for _, k := range slices.Sorted(maps.Keys(o.Faults)) {
		if o.Faults[k] == 0 {
			continue
		}
		total += o.Faults[k]
		fmt.Fprintf(&b, " %s=%d", k, o.Faults[k])
	}
	return fmt.Sprintf("%d faults:%s", total, b.String())
}

func (s *Scenario) defaults() {
	if s.Duration == 0 {
		s.Duration = 20 * time.Second
	}
	if s.Proxies == 0 {
		s.Proxies = 3
	}
	if s.Lease == 0 {
		s.Lease = 2 * time.Second
	}
	if s.RecoverInterval == 0 {
		s.RecoverInterval = time.Second
	}
	if s.UpstreamTimeout == 0 {
		s.UpstreamTimeout = 3 * time.Second
	}
	if s.UpstreamDeadline == 0 {
		s.UpstreamDeadline = 5 * time.Second
	}
	if s.UpstreamIdle == 0 {
		s.UpstreamIdle = 200 * time.Millisecond
	}
	if s.Ambiguous == "" {
		s.Ambiguous = "escalate"
	}
	if s.Clients == 0 {
		s.Clients = 8
	}
	if s.Rate == 0 {
		s.Rate = 120
	}
	if s.Mix == nil {
		s.Mix = DefaultMix
	}
	if s.FaultEvery == 0 {
		s.FaultEvery = 250 * time.Millisecond
	}
	if s.Settle == 0 {
		s.Settle = 60 * time.Second
	}
	if s.Logf == nil {
		s.Logf = func(string, ...any) {}
	}
}

// Run runs the scenario. An error means the scenario could not run (a
// proxy that never started, a store that cannot be read); broken
// invariants are in the Outcome's Report.
func (s *Scenario) Run(ctx context.Context) (*Outcome, error) {
	s.defaults()
	up := NewUpstream()
	up.StallMax = s.Lease + s.Lease/2 // past the lease: only heartbeats keep it
	srv := httptest.NewUnstartedServer(up)
	srv.Config.IdleTimeout = s.UpstreamIdle
	idleClosed := countIdleCloses(srv.Config)
	srv.Start()
	defer srv.Close()
	defer up.Calm() // release stalled handlers before srv.Close waits for them

	cfgPath := filepath.Join(s.Dir, "idem.yaml")
	cfg, err := yaml.Marshal(map[string]any{
		"upstream":          srv.URL,
		"store":             s.StoreURL,
		"lease":             s.Lease.String(),
		"retention":         "1h",
		"recover_interval":  s.RecoverInterval.String(),
		"purge_interval":    "1h",
		"upstream_timeout":  s.UpstreamTimeout.String(),
		"upstream_deadline": s.UpstreamDeadline.String(),
		"shutdown_timeout":  "3s",
		"log_level":         "info",
		"ambiguous":         s.Ambiguous,
		"anonymous":         "shared", // some clients send no Authorization
		// Clients reach each proxy at its own address: every host is one
		// API, and the upstream has one name (see StoreKey).
		"host_aliases":  []string{"*"},
		"upstream_name": chaosUpstream,
	})
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		return nil, err
	}
	out := &Outcome{Faults: map[string]int64{}}
	waits := []string{"0s", "1s", "300ms"}
	for i := range s.Proxies {
		args := append([]string{"--config", cfgPath, "--wait", waits[i%len(waits)]}, s.ExtraArgs...)
		out.Procs = append(out.Procs, &Proc{
			Name: fmt.Sprintf("%s-proxy%d", s.Name, i), Bin: s.Bin, Args: args,
			LogPath: filepath.Join(s.Dir, fmt.Sprintf("proxy%d.log", i)),
		})
	}
	defer func() {
		for _, p := range out.Procs {
			_ = p.Stop(5 * time.Second)
			_ = p.Close()
			out.Alarms = append(out.Alarms, p.Alarms()...)
		}
	}()
	if err := s.startAll(ctx, out.Procs); err != nil {
		return out, err
	}

	load := &Load{
		Targets: func() []string {
			addrs := make([]string, len(out.Procs))
			for i, p := range out.Procs {
				addrs[i] = p.Addr()
			}
			return addrs
		},
		Scopes:  []string{"", "Bearer alice", "Bearer bob", "Bearer carol"},
		Clients: s.Clients,
		Rate:    s.Rate,
	}
	defer load.Close()

	// The fault phase.
	s.Logf("%s: fault phase of %v, %d proxies, lease %v", s.Name, s.Duration, s.Proxies, s.Lease)
	up.SetMix(s.Mix)
	loadCtx, stopLoad := context.WithCancel(ctx)
	var loadDone sync.WaitGroup
	loadDone.Go(func() { load.Run(loadCtx) })
	faultCtx, stopFaults := context.WithTimeout(ctx, s.Duration)
	s.faults(faultCtx, out)
	stopFaults()

	// Calm: no more faults, the clients stop, every proxy runs again.
	if s.Relay != nil {
		s.Relay.SetDown(false)
		s.Relay.SetDelay(0)
		s.Relay.dropReply.Store(nil)
		s.Relay.halfWrite.Store(false)
	}
	up.Calm()
	stopLoad()
	loadDone.Wait()
	if err := s.startAll(ctx, out.Procs); err != nil {
		return out, err
	}

	// Recovery: no record may stay pending.
	calm := time.Now()
	if err := s.settle(ctx); err != nil {
		s.Logf("%s: %v", s.Name, err) // the pending records are reported as violations
	}
	out.Recovery = time.Since(calm)

	keys := map[ExecKey]bool{}
	for _, a := range load.Attempts() {
		keys[a.Key] = true
	}
	for k := range up.Executions() {
		keys[k] = true
	}
	records, err := s.records(ctx, keys)
	if err != nil {
		return out, err
	}
	s.verify(ctx, load, records)

	out.Report = Check(up.Executions(), load.Attempts(), records)
	for f, n := range up.Counts() {
		if f != FaultNone {
			out.Faults["upstream/"+string(f)] += n
		}
	}
	out.Faults["upstream/idle_closed"] = idleClosed.Load()
	for _, a := range load.Attempts() {
		if a.Hangup {
			out.Faults["client/hangup"]++
		}
	}
	if s.Relay != nil {
		st := s.Relay.Stats()
		out.Faults["relay/cut"] += st.Cuts
		out.Faults["relay/dropped_reply"] += st.DroppedReplies
		out.Faults["relay/half_write"] += st.HalfWrites
		out.Faults["relay/outage"] += st.Outages
		out.Faults["relay/slow"] += st.SlowSpells
	}
	return out, nil
}

// startAll starts the proxies that are not running and waits until every
// one is ready.
func (s *Scenario) startAll(ctx context.Context, procs []*Proc) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for _, p := range procs {
		if !p.Running() {
			if err := p.Start(ctx); err != nil {
				return err
			}
		}
	}
	for _, p := range procs {
		if err := p.Ready(ctx); err != nil {
			return fmt.Errorf("%w\n%s", err, p.Tail(20))
		}
	}
	return nil
}

// faults injects faults on every tick until ctx ends.
func (s *Scenario) faults(ctx context.Context, out *Outcome) {
	type kind struct {
		name   string
		weight int
		relay  bool
	}
	kinds := []kind{
		{"none", 6, false},
		{"proxy/kill9", 1, false},
		{"proxy/sigterm", 1, false},
		{"cut", 4, true},
		{"cut_all", 1, true},
		{"drop_reply", 5, true},
		{"half_write", 2, true},
		{"outage", 1, true},
		{"slow", 1, true},
	}
	total := 0
	for _, k := range kinds {
		if !k.relay || s.Relay != nil {
			total += k.weight
		}
	}
	var outageUntil, slowUntil time.Time
	tick := time.NewTicker(s.FaultEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// A proxy that failed to restart gets another chance.
		for _, p := range out.Procs {
			if !p.Running() {
				if err := p.Start(ctx); err != nil && ctx.Err() == nil {
					s.Logf("%s: restarting %s: %v", s.Name, p.Name, err)
				}
			}
		}
		if s.Relay != nil && s.Relay.Down() && time.Now().After(outageUntil) {
			s.Relay.SetDown(false)
		}
		if s.Relay != nil && !slowUntil.IsZero() && time.Now().After(slowUntil) {
			s.Relay.SetDelay(0)
			slowUntil = time.Time{}
		}
		n := rand.IntN(total)
		var k kind
		for _, k = range kinds {
			if k.relay && s.Relay == nil {
				continue
			}
			if n < k.weight {
				break
			}
			n -= k.weight
		}
		switch k.name {
		case "proxy/kill9", "proxy/sigterm":
			p := out.Procs[rand.IntN(len(out.Procs))]
			if !p.Running() {
				continue
			}
			var err error
			if k.name == "proxy/kill9" {
				err = p.Kill()
			} else {
				err = p.Stop(5 * time.Second)
			}
			if err != nil {
				s.Logf("%s: %s %s: %v", s.Name, k.name, p.Name, err)
			}
			out.Faults[k.name]++
			if err := p.Start(ctx); err != nil && ctx.Err() == nil {
				s.Logf("%s: restarting %s: %v", s.Name, p.Name, err)
			}
		case "cut":
			s.Relay.CutRandom()
		case "cut_all":
			s.Relay.CutAll()
		case "drop_reply":
			if rand.IntN(3) == 0 || len(s.DropPatterns) == 0 {
				s.Relay.DropNextReply()
			} else {
				s.Relay.DropNextReply(s.DropPatterns...)
			}
		case "half_write":
			s.Relay.HalfWriteNext()
		case "slow":
			if slowUntil.IsZero() {
				// Up to 600ms a chunk, for 1 to 3 seconds: a heartbeat
				// (every lease/3) can arrive after its lease ran out.
				slowUntil = time.Now().Add(time.Second + rand.N(2*time.Second))
				s.Relay.SetDelay(600 * time.Millisecond)
			}
		case "outage":
			if !s.Relay.Down() {
				outageUntil = time.Now().Add(300*time.Millisecond + rand.N(1700*time.Millisecond))
				s.Relay.SetDown(true)
			}
		}
	}
}

// settle polls the store until it holds no pending record, or s.Settle
// passes.
func (s *Scenario) settle(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.Settle)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		page, err := s.Inspect.List(ctx, idemstore.ListParams{State: idemstore.StatePending, Limit: 10})
		if err == nil && len(page.Records) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("listing pending records: %w", err)
			}
			return fmt.Errorf("records still pending after %v", s.Settle)
		case <-tick.C:
		}
	}
}

// records reads every key's record directly from the store; absent ones
// map to nil.
func (s *Scenario) records(ctx context.Context, keys map[ExecKey]bool) (map[ExecKey]*idemstore.Record, error) {
	out := make(map[ExecKey]*idemstore.Record, len(keys))
	for k := range keys {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		rec, err := s.Inspect.Get(rctx, StoreKey(k))
		cancel()
		switch {
		case errors.Is(err, idemstore.ErrNotFound):
			out[k] = nil
		case err != nil:
			return nil, fmt.Errorf("reading the record of %q: %w", k.Key, err)
		default:
			out[k] = rec
		}
	}
	return out, nil
}

// verify sends each completed or reviewed key once more, through random
// proxies, four at a time.
func (s *Scenario) verify(ctx context.Context, load *Load, records map[ExecKey]*idemstore.Record) {
	keys := make(chan ExecKey)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for k := range keys {
				load.Send(ctx, 0, -1, k, BodyFor(k), true)
			}
		})
	}
	for k, rec := range records {
		if rec != nil && rec.State != idemstore.StatePending {
			keys <- k
		}
	}
	close(keys)
	wg.Wait()
}

// countIdleCloses counts the keep-alive connections srv closes for being
// idle.
func countIdleCloses(srv *http.Server) *atomic.Int64 {
	var n atomic.Int64
	var mu sync.Mutex
	idle := map[net.Conn]bool{}
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		switch st {
		case http.StateIdle:
			idle[c] = true
		case http.StateActive:
			delete(idle, c)
		case http.StateClosed, http.StateHijacked:
			if idle[c] {
				n.Add(1)
			}
			delete(idle, c)
		}
	}
	return &n
}

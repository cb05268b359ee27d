package chaos

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Relay is a TCP relay between a store's clients and the store that injects
// the faults of a network and of a server that goes away: it cuts open
// connections, lets a statement reach the server and drops its reply (the
// statement ran; the client never hears so), delivers half a message and
// cuts, delays every chunk (a slow network or an overloaded server), and
// emulates an outage by refusing every new connection and cutting the open
// ones. Cuts are resets (SO_LINGER 0), as a crashed peer
// or a middlebox would send.
type Relay struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns map[*relayConn]struct{}
	down  bool

	dropReply atomic.Pointer[[][]byte] // armed patterns, nil when disarmed
	halfWrite atomic.Bool
	delay     atomic.Int64 // the longest delay of a chunk, in nanoseconds

	stats relayCounters
	wg    sync.WaitGroup
}

// RelayStats counts the faults a relay injected (not the ones it was asked
// for: an armed drop that no statement triggered is not counted).
type RelayStats struct {
	Connections    int64 // accepted and relayed
	Cuts           int64 // open connections reset by Cut, CutAll or an outage
	DroppedReplies int64 // replies swallowed after the statement reached the server
	HalfWrites     int64 // messages cut in the middle
	Refused        int64 // connections reset at once during an outage
	Outages        int64
	SlowSpells     int64 // times SetDelay turned delays on
}

type relayCounters struct {
	connections, cuts, dropped, half, refused, outages, slow atomic.Int64
}

// NewRelay starts a relay to target (host:port) on a loopback port.
func NewRelay(target string) (*Relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("relay to %s: %w", target, err)
	}
	r := &Relay{ln: ln, target: target, conns: map[*relayConn]struct{}{}}
	r.wg.Add(1)
	go r.serve()
	return r, nil
}

// Addr is the address clients dial instead of the store's.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// Target is the store's address.
func (r *Relay) Target() string { return r.target }

// Close stops accepting, resets every open connection and waits for the
// relay's goroutines.
func (r *Relay) Close() error {
	err := r.ln.Close()
	r.CutAll()
	r.wg.Wait()
	return err
}

// Stats returns what the relay injected so far.
func (r *Relay) Stats() RelayStats {
	return RelayStats{
		Connections: r.stats.connections.Load(), Cuts: r.stats.cuts.Load(), DroppedReplies: r.stats.dropped.Load(),
		HalfWrites: r.stats.half.Load(), Refused: r.stats.refused.Load(), Outages: r.stats.outages.Load(),
		SlowSpells: r.stats.slow.Load(),
	}
}

// Open returns how many connections are open.
func (r *Relay) Open() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.conns)
}

// CutRandom resets one open connection chosen at random, and reports
// whether there was one.
func (r *Relay) CutRandom() bool {
	r.mu.Lock()
	var victim *relayConn
	if n := len(r.conns); n > 0 {
		i := rand.IntN(n)
		for c := range r.conns {
			if i == 0 {
				victim = c
				break
			}
			i--
		}
	}
	r.mu.Unlock()
	if victim == nil {
		return false
	}
	if victim.cut() {
		r.stats.cuts.Add(1)
	}
	return true
}

// CutAll resets every open connection and returns how many it reset.
func (r *Relay) CutAll() int {
	r.mu.Lock()
	victims := make([]*relayConn, 0, len(r.conns))
	for c := range r.conns {
		victims = append(victims, c)
	}
	r.mu.Unlock()
	n := 0
	for _, c := range victims {
		if c.cut() {
			n++
		}
	}
	r.stats.cuts.Add(int64(n))
	return n
}

// DropNextReply arms the relay: the next chunk a client sends that contains
// one of patterns (any chunk when none are given) is delivered to the
// server, and the server's reply is swallowed and the connection reset.
// Patterns are matched case-insensitively (give them in upper case).
// Arming an armed relay replaces its patterns.
func (r *Relay) DropNextReply(patterns ...[]byte) {
	p := append([][]byte(nil), patterns...)
	r.dropReply.Store(&p)
}

// HalfWriteNext arms the relay: the next chunk a client sends is delivered
// only in part, and the connection is reset.
func (r *Relay) HalfWriteNext() { r.halfWrite.Store(true) }

// SetDelay delays every chunk, both ways, by a random duration below max;
// zero ends the delays.
func (r *Relay) SetDelay(max time.Duration) {
	if old := r.delay.Swap(int64(max)); old == 0 && max > 0 {
		r.stats.slow.Add(1)
	}
}

// lag pauses a chunk while delays are on. The pause is the fault itself,
// not a synchronisation.
func (r *Relay) lag() {
	if d := time.Duration(r.delay.Load()); d > 0 {
		time.Sleep(rand.N(d))
	}
}

// SetDown starts (true) or ends (false) an outage: while down, the relay
// resets every new connection at once; starting one also resets the open
// ones, as a server that restarts would.
func (r *Relay) SetDown(down bool) {
	r.mu.Lock()
	was := r.down
	r.down = down
	r.mu.Unlock()
	if down && !was {
		r.stats.outages.Add(1)
		r.CutAll()
	}
}

// Down reports whether an outage is under way.
func (r *Relay) Down() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.down
}

func (r *Relay) serve() {
	defer r.wg.Done()
	for {
		client, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		down := r.down
		r.mu.Unlock()
		if down {
			r.stats.refused.Add(1)
			reset(client)
			continue
		}
		r.wg.Add(1)
		go r.relay(client)
	}
}

// relay connects client to the target and copies both ways until either
// side ends or the relay cuts the pair.
func (r *Relay) relay(client net.Conn) {
	defer r.wg.Done()
	server, err := net.DialTimeout("tcp", r.target, 5*time.Second)
	if err != nil {
		reset(client)
		return
	}
	c := &relayConn{client: client, server: server, swallow: make(chan struct{})}
	r.mu.Lock()
	if r.down {
		r.mu.Unlock()
		r.stats.refused.Add(1)
		c.cut()
		return
	}
	r.conns[c] = struct{}{}
	r.mu.Unlock()
	r.stats.connections.Add(1)
	defer func() {
		r.mu.Lock()
		delete(r.conns, c)
		r.mu.Unlock()
	}()

	done := make(chan struct{})
	go func() { // server → client
		defer close(done)
		buf := make([]byte, 32<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 {
				select {
				case <-c.swallow:
					// The server answered the statement whose reply is
					// to be lost.
					r.stats.dropped.Add(1)
					c.cut()
					return
				default:
				}
				r.lag()
				if _, werr := client.Write(buf[:n]); werr != nil {
					c.cut()
					return
				}
			}
			if err != nil {
				c.cut()
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for { // client → server
		n, err := client.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if n > 1 && r.halfWrite.CompareAndSwap(true, false) {
				_, _ = server.Write(chunk[:n/2])
				r.stats.half.Add(1)
				c.cut()
				break
			}
			if r.matchDrop(chunk) {
				// Deliver, then swallow whatever the server says next; a
				// server that says nothing loses the connection anyway.
				close(c.swallow)
				_, _ = server.Write(chunk)
				time.AfterFunc(3*time.Second, func() { c.cut() })
				break
			}
			r.lag()
			if _, werr := server.Write(chunk); werr != nil {
				c.cut()
				break
			}
		}
		if err != nil {
			c.cut()
			break
		}
	}
	<-done
}

// matchDrop reports whether chunk triggers the armed reply drop, and
// disarms it if so.
func (r *Relay) matchDrop(chunk []byte) bool {
	p := r.dropReply.Load()
	if p == nil {
		return false
	}
	if len(*p) > 0 {
		up := bytes.ToUpper(chunk)
		hit := false
		for _, pat := range *p {
			if bytes.Contains(up, pat) {
				hit = true
				break
			}
		}
		if !hit {
			return false
		}
	}
	return r.dropReply.CompareAndSwap(p, nil)
}

// relayConn is one relayed connection.
type relayConn struct {
	client, server net.Conn
	swallow        chan struct{} // closed when the next reply is to be dropped
	once           sync.Once
}

// cut resets both sides; it reports whether this call did it.
func (c *relayConn) cut() bool {
	done := false
	c.once.Do(func() {
		reset(c.client)
		reset(c.server)
		done = true
	})
	return done
}

// reset closes conn with a TCP reset instead of an orderly close.
func reset(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

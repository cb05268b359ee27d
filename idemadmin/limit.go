package idemadmin

import (
	"container/list"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// maxLimitedAddrs bounds the client addresses whose failed sign-ins are
// counted. Past it, the address that failed least recently is forgotten:
// an attacker who fails from more addresses than that gives some of them
// their tries back, but never takes any from an address that did not fail.
const maxLimitedAddrs = 10000

// signInLimiter counts failed sign-ins (the page's form, the API's Bearer
// token) per client address, in this process's memory: each address may
// fail Config.SignInFailures times in a row, and regains one try every
// Config.SignInRegain. An address that has used them up is refused before
// its token is even compared, until it regains one. A sign-in that
// succeeds costs nothing.
//
// Only addresses that failed are tracked, and at most max of them, least
// recently failed (or refused) first out: an address with no failures of
// its own is never refused, however many others fail.
type signInLimiter struct {
	burst  float64
	regain time.Duration
	max    int

	mu     sync.Mutex
	byAddr map[string]*list.Element // of *failures, in order
	order  list.List                // least recently failed or refused first
}

type failures struct {
	addr   string
	left   float64   // tries left at
	at     time.Time // this time
	warned bool      // the refusal was logged since the tries ran out
}

func newSignInLimiter(burst int, regain time.Duration) *signInLimiter {
	return &signInLimiter{burst: float64(burst), regain: regain, max: maxLimitedAddrs, byAddr: map[string]*list.Element{}}
}

// lookupLocked returns addr's count brought up to now, or nil when addr
// has every try left (and is then forgotten).
func (l *signInLimiter) lookupLocked(addr string, now time.Time) *list.Element {
	e := l.byAddr[addr]
	if e == nil {
		return nil
	}
	f := e.Value.(*failures)
	if d := now.Sub(f.at); d > 0 {
		f.left = min(l.burst, f.left+float64(d)/float64(l.regain))
		f.at = now
	}
	if f.left >= l.burst {
		l.order.Remove(e)
		delete(l.byAddr, addr)
		return nil
	}
	if f.left >= 1 {
		f.warned = false
	}
	return e
}

// allow reports whether addr may try to sign in at now; if not, how long
// until it may, and whether this is the first refusal since its tries ran
// out (the one to log). A refused address keeps its place among the most
// recent, so an attacker who goes on trying stays counted.
func (l *signInLimiter) allow(addr string, now time.Time) (ok bool, wait time.Duration, first bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.lookupLocked(addr, now)
	if e == nil {
		return true, 0, false
	}
	f := e.Value.(*failures)
	if f.left >= 1 {
		return true, 0, false
	}
	l.order.MoveToBack(e)
	first, f.warned = !f.warned, true
	return false, time.Duration((1 - f.left) * float64(l.regain)), first
}

// fail counts a failed sign-in from addr and returns the tries it has
// left.
func (l *signInLimiter) fail(addr string, now time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.lookupLocked(addr, now)
	if e == nil {
		for len(l.byAddr) >= l.max {
			oldest := l.order.Front()
			delete(l.byAddr, oldest.Value.(*failures).addr)
			l.order.Remove(oldest)
		}
		e = l.order.PushBack(&failures{addr: addr, left: l.burst, at: now})
		l.byAddr[addr] = e
	} else {
		l.order.MoveToBack(e)
	}
	f := e.Value.(*failures)
	f.left = max(f.left-1, 0)
	return int(f.left)
}

// tracked returns how many addresses are counted.
func (l *signInLimiter) tracked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.byAddr)
}

// clientAddr is the address failed sign-ins are counted by: the peer's,
// or, when the peer is one of trusted (a load balancer in front), the
// nearest address of X-Forwarded-For that is not. An IPv4 address counts
// alone (an IPv4-mapped IPv6 address as the IPv4 address it maps); an
// IPv6 address by its network of v6Bits bits (a /64, which one host
// usually holds whole, by default), so that a host cannot get new tries
// by picking new addresses from its own network.
func clientAddr(r *http.Request, trusted []netip.Prefix, v6Bits int) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	addr = addr.Unmap()
	if isTrusted(addr, trusted) {
		hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
		for i := len(hops) - 1; i >= 0; i-- {
			hop, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
			if err != nil {
				break // what is left of the header cannot be trusted
			}
			addr = hop.Unmap()
			if !isTrusted(addr, trusted) {
				break
			}
		}
	}
	if addr.Is6() {
		p, _ := addr.WithZone("").Prefix(v6Bits)
		return p.String()
	}
	return addr.String()
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

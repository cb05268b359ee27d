package idemadmin

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// maxLimitedAddrs bounds the client addresses whose failed sign-ins are
// counted; past it, addresses not yet counted share one count.
const maxLimitedAddrs = 10000

// signInLimiter counts failed sign-ins (the page's form, the API's Bearer
// token) per client address, in this process's memory: each address may
// fail Config.SignInFailures times in a row, and regains one try every
// Config.SignInRegain. An address that has used them up is refused before
// its token is even compared, until it regains one. A sign-in that
// succeeds costs nothing.
type signInLimiter struct {
	burst  float64
	regain time.Duration

	mu     sync.Mutex
	byAddr map[string]*failures
}

type failures struct {
	left   float64   // tries left at
	at     time.Time // this time
	warned bool      // the refusal was logged since the tries ran out
}

func newSignInLimiter(burst int, regain time.Duration) *signInLimiter {
	return &signInLimiter{burst: float64(burst), regain: regain, byAddr: map[string]*failures{}}
}

// entryLocked returns addr's count, brought up to now.
func (l *signInLimiter) entryLocked(addr string, now time.Time) *failures {
	f := l.byAddr[addr]
	if f == nil {
		if len(l.byAddr) >= maxLimitedAddrs {
			l.pruneLocked(now)
		}
		if len(l.byAddr) >= maxLimitedAddrs {
			return l.entryLocked("(others)", now)
		}
		f = &failures{left: l.burst, at: now}
		l.byAddr[addr] = f
	}
	if d := now.Sub(f.at); d > 0 {
		f.left = min(l.burst, f.left+float64(d)/float64(l.regain))
		f.at = now
	}
	if f.left >= 1 {
		f.warned = false
	}
	return f
}

// pruneLocked forgets the addresses that have all their tries back.
func (l *signInLimiter) pruneLocked(now time.Time) {
	for addr, f := range l.byAddr {
		if f.left+float64(now.Sub(f.at))/float64(l.regain) >= l.burst {
			delete(l.byAddr, addr)
		}
	}
}

// allow reports whether addr may try to sign in at now; if not, how long
// until it may, and whether this is the first refusal since its tries ran
// out (the one to log).
func (l *signInLimiter) allow(addr string, now time.Time) (ok bool, wait time.Duration, first bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.entryLocked(addr, now)
	if f.left >= 1 {
		return true, 0, false
	}
	first, f.warned = !f.warned, true
	return false, time.Duration((1 - f.left) * float64(l.regain)), first
}

// fail counts a failed sign-in from addr and returns the tries it has
// left.
func (l *signInLimiter) fail(addr string, now time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.entryLocked(addr, now)
	f.left = max(f.left-1, 0)
	return int(f.left)
}

// clientAddr is the address failed sign-ins are counted by: the peer's,
// or, when the peer is one of trusted (a load balancer in front), the
// nearest address of X-Forwarded-For that is not. An IPv6 address counts
// by its /64, which one host usually holds whole.
func clientAddr(r *http.Request, trusted []netip.Prefix) string {
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
		p, _ := addr.Prefix(64)
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

// Package dropproxy is a TCP proxy for tests that simulates a lost commit
// acknowledgement: the database runs the COMMIT, and the client never hears
// that it did. The SQL stores' tests use it to prove that release-if-pending
// leaves a committed record alone.
package dropproxy

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy forwards TCP between a client and addr. Once armed, it passes
// the next COMMIT to the server, waits for the server's answer, and drops
// the connection instead of forwarding that answer: the transaction
// committed, but the client never hears so.
type Proxy struct {
	ln    net.Listener
	addr  string
	armed atomic.Pointer[[]byte] // the pattern to drop the answer to, nil when disarmed
	wg    sync.WaitGroup
}

// New starts a proxy to addr on a loopback port; it stops when the test
// ends.
func New(t testing.TB, addr string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, addr: addr}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() { _ = ln.Close(); p.wg.Wait() })
	return p
}

// Addr is the address clients connect to instead of the server's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// DropNextCommit arms the proxy: the next chunk a client sends that holds
// COMMIT reaches the server, and the server's answer is dropped with the
// connection.
func (p *Proxy) DropNextCommit() { p.DropNext([]byte("COMMIT")) }

// DropNext arms the proxy like DropNextCommit for the next chunk that
// holds pattern (compared in upper case): a Redis script, for instance.
func (p *Proxy) DropNext(pattern []byte) { p.armed.Store(&pattern) }

// Armed reports whether the proxy is still waiting for the chunk to drop
// the answer to.
func (p *Proxy) Armed() bool { return p.armed.Load() != nil }

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.addr)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.wg.Add(2)
		commitSent := make(chan struct{})
		var once sync.Once
		closeBoth := func() { _ = client.Close(); _ = server.Close() }
		go func() { // client → server
			defer p.wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := client.Read(buf)
				if n > 0 {
					chunk := buf[:n]
					if pat := p.armed.Load(); pat != nil && bytes.Contains(bytes.ToUpper(chunk), *pat) && p.armed.CompareAndSwap(pat, nil) {
						// Leave the connection open: the server must
						// receive and run the COMMIT; the other
						// direction closes it once the answer comes.
						close(commitSent)
						_, _ = server.Write(chunk)
						return
					}
					if _, werr := server.Write(chunk); werr != nil {
						once.Do(closeBoth)
						return
					}
				}
				if err != nil {
					once.Do(closeBoth)
					return
				}
			}
		}()
		go func() { // server → client
			defer p.wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := server.Read(buf)
				select {
				case <-commitSent:
					// The server answered the COMMIT: swallow it and drop.
					once.Do(closeBoth)
					return
				default:
				}
				if n > 0 {
					if _, werr := client.Write(buf[:n]); werr != nil {
						once.Do(closeBoth)
						return
					}
				}
				if err != nil {
					once.Do(closeBoth)
					return
				}
			}
		}()
	}
}

// Package toolproc holds what the measuring tools under internal/tools share
// about the idem serve process they start: a free loopback address, an
// upstream, the process started and waited for until it listens, and its
// resident memory read from /proc (Linux only).
package toolproc

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Memory is a process's resident memory now (RSS) and at its peak (HWM),
// in bytes.
type Memory struct{ RSS, HWM int64 }

// Settled polls pid's memory until its resident size has not changed for
// d (at most two minutes), and returns it.
func Settled(pid int, d time.Duration) Memory {
	last, since := Read(pid), time.Now()
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		m := Read(pid)
		if m.RSS != last.RSS {
			last, since = m, time.Now()
			continue
		}
		last = m
		if time.Since(since) >= d {
			break
		}
	}
	return last
}

// Read returns pid's VmRSS and VmHWM, in bytes.
func Read(pid int) Memory {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		log.Fatal(err)
	}
	var m Memory
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			m.RSS = kb << 10
		case "VmHWM:":
			m.HWM = kb << 10
		}
	}
	return m
}

// MiB is n bytes in mebibytes.
func MiB(n int64) float64 { return float64(n) / (1 << 20) }

// FreeAddr returns a loopback address that was free a moment ago.
func FreeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// WaitListening waits up to 10 seconds for something to accept
// connections on addr, and exits the tool if nothing does.
func WaitListening(addr string) {
	for range 200 {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	log.Fatalf("idem serve did not listen on %s", addr)
}

// Upstream serves h on a free loopback address, for as long as the tool
// runs, and returns the address.
func Upstream(h http.HandlerFunc) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go http.Serve(l, h)
	return l.Addr().String()
}

// Discard answers status after reading the request's body to its end.
func Discard(status int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(status)
	}
}

// Serve starts bin (idem) with args, its standard error the tool's, killed
// if the tool dies, and waits for it to listen on addr (one of args). The
// caller kills it when done.
func Serve(bin, addr string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	WaitListening(addr)
	return cmd
}

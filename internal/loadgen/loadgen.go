// Package loadgen drives an HTTP endpoint with keep-alive connections and
// reports throughput and latency. idem's load scripts use it through
// internal/tools/loadgen; it exists so that the figures in BENCHMARKS.md come
// from one tool, bounded in requests and time, aimed only at loopback.
package loadgen

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Options describe a load run.
type Options struct {
	// URL is the target; only loopback hosts are accepted.
	URL string
	// Method defaults to POST.
	Method string
	// Body is sent with every request.
	Body string
	// Connections is the number of concurrent keep-alive connections.
	// Defaults to 16.
	Connections int
	// Duration bounds the run. Defaults to 10s.
	Duration time.Duration
	// MaxRequests bounds the run too; 0 means 10 million.
	MaxRequests int64
	// UniqueKeys sends a fresh Idempotency-Key with every request.
	UniqueKeys bool
	// KeyPrefix makes keys unique across runs.
	KeyPrefix string
	// Header is added to every request.
	Header http.Header
}

// Result summarises a run.
type Result struct {
	Requests  int64
	Errors    int64
	Statuses  map[int]int64
	Elapsed   time.Duration
	P50, P99  time.Duration
	PerSecond float64
}

// String formats the result on one line, as the load scripts print it.
func (r Result) String() string {
	codes := make([]int, 0, len(r.Statuses))
	for c := range r.Statuses {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	var sb strings.Builder
	for _, c := range codes {
		fmt.Fprintf(&sb, " %d:%d", c, r.Statuses[c])
	}
	return fmt.Sprintf("requests=%d errors=%d rps=%.0f p50=%s p99=%s statuses:%s",
		r.Requests, r.Errors, r.PerSecond, r.P50, r.P99, sb.String())
}

// Run performs the load run.
func Run(ctx context.Context, o Options) (Result, error) {
	if o.Method == "" {
		o.Method = http.MethodPost
	}
	if o.Connections <= 0 {
		o.Connections = 16
	}
	if o.Duration <= 0 {
		o.Duration = 10 * time.Second
	}
	if o.MaxRequests <= 0 {
		o.MaxRequests = 10_000_000
	}
	u, err := url.Parse(o.URL)
	if err != nil {
		return Result{}, err
	}
	if ip := net.ParseIP(u.Hostname()); u.Hostname() != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return Result{}, fmt.Errorf("loadgen: %s is not a loopback address", u.Hostname())
	}
	tr := &http.Transport{MaxIdleConnsPerHost: o.Connections, MaxConnsPerHost: o.Connections, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	ctx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()

	var seq, errs atomic.Int64
	lat := make([][]time.Duration, o.Connections)
	statuses := make([]map[int]int64, o.Connections)
	var wg sync.WaitGroup
	start := time.Now()
	for c := 0; c < o.Connections; c++ {
		statuses[c] = map[int]int64{}
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			body := strings.NewReader(o.Body)
			for ctx.Err() == nil {
				n := seq.Add(1)
				if n > o.MaxRequests {
					return
				}
				body.Reset(o.Body)
				req, _ := http.NewRequestWithContext(ctx, o.Method, o.URL, body)
				req.ContentLength = int64(len(o.Body))
				req.Header.Set("Content-Type", "application/json")
				for k, v := range o.Header {
					req.Header[k] = v
				}
				if o.UniqueKeys {
					req.Header.Set("Idempotency-Key", o.KeyPrefix+strconv.FormatInt(n, 10))
				}
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						errs.Add(1)
					}
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				lat[c] = append(lat[c], time.Since(t0))
				statuses[c][resp.StatusCode]++
			}
		}(c)
	}
	wg.Wait()
	elapsed := time.Since(start)
	res := Result{Errors: errs.Load(), Statuses: map[int]int64{}, Elapsed: elapsed}
	var all []time.Duration
	for c := range lat {
		all = append(all, lat[c]...)
		for k, v := range statuses[c] {
			res.Statuses[k] += v
		}
	}
	res.Requests = int64(len(all))
	if len(all) > 0 {
		slices.Sort(all)
		res.P50 = all[len(all)/2]
		res.P99 = all[len(all)*99/100]
	}
	res.PerSecond = float64(res.Requests) / elapsed.Seconds()
	return res, nil
}

// Command loadgen sends keep-alive HTTP load to a loopback endpoint and
// prints throughput and latency percentiles. It is bounded by -d and -n.
//
//	go run ./internal/tools/loadgen -url http://127.0.0.1:8080/payments -c 16 -d 10s -unique-keys
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"strings"
	"time"

	"github.com/idem-dev/idem/internal/loadgen"
)

func main() {
	var o loadgen.Options
	var headers string
	flag.StringVar(&o.URL, "url", "", "target URL (loopback only)")
	flag.StringVar(&o.Method, "method", "POST", "HTTP method")
	flag.StringVar(&o.Body, "body", `{"amount":1000,"currency":"usd"}`, "request body")
	flag.IntVar(&o.Connections, "c", 16, "concurrent keep-alive connections")
	flag.DurationVar(&o.Duration, "d", 10*time.Second, "duration")
	flag.Int64Var(&o.MaxRequests, "n", 0, "maximum requests (0: 10 million)")
	flag.BoolVar(&o.UniqueKeys, "unique-keys", false, "send a fresh Idempotency-Key with every request")
	flag.StringVar(&o.KeyPrefix, "key-prefix", fmt.Sprintf("load-%d-", time.Now().UnixNano()), "prefix of generated keys")
	flag.StringVar(&headers, "H", "", "extra headers, 'Name: value' separated by ';'")
	flag.Parse()
	if o.URL == "" {
		log.Fatal("loadgen: -url is required")
	}
	if headers != "" {
		o.Header = http.Header{}
		for _, h := range strings.Split(headers, ";") {
			name, value, ok := strings.Cut(h, ":")
			if !ok {
				log.Fatalf("loadgen: bad header %q", h)
			}
			o.Header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
		}
	}
	res, err := loadgen.Run(context.Background(), o)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res)
}

// Command plainproxy is the baseline of scripts/bench-proxy.sh: an
// httputil.ReverseProxy with the same Rewrite, buffer pool and transport as
// idem serve, and no idempotency layer.
//
//	go run ./internal/tools/plainproxy -listen 127.0.0.1:8090 -upstream http://127.0.0.1:8091
package main

import (
	"flag"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	"github.com/idem-dev/idem/idemproxy"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8090", "address to listen on")
	upstream := flag.String("upstream", "", "upstream base URL")
	flag.Parse()
	u, err := url.Parse(*upstream)
	if err != nil || u.Host == "" {
		log.Fatalf("plainproxy: -upstream must be a URL, got %q", *upstream)
	}
	pool := &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}
	rp := &httputil.ReverseProxy{
		Rewrite:    func(pr *httputil.ProxyRequest) { pr.SetURL(u); pr.SetXForwarded() },
		Transport:  idemproxy.NewTransport(60 * time.Second),
		BufferPool: pool,
	}
	srv := &http.Server{Addr: *listen, Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte  { return *b.p.Get().(*[]byte) }
func (b *bufferPool) Put(v []byte) { b.p.Put(&v) }

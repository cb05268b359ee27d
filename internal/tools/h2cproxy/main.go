// Command h2cproxy is a stock reverse proxy for gRPC: httputil.ReverseProxy
// with an HTTP/2 (h2c) transport, on a listener that serves h2c. It is the
// yardstick idem serve's gRPC throughput is compared with
// (scripts/bench-grpc-proxy.sh): the same work, less idempotency.
//
//	go run ./internal/tools/h2cproxy -listen 127.0.0.1:50161 -upstream 127.0.0.1:50151
package main

import (
	"flag"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:50161", "loopback address to serve")
	upstream := flag.String("upstream", "127.0.0.1:50151", "the h2c upstream's host:port")
	flag.Parse()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p, MaxIdleConnsPerHost: 256}
	rp := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(&url.URL{Scheme: "http", Host: *upstream}) },
		Transport: tr,
	}
	var sp http.Protocols
	sp.SetHTTP1(true)
	sp.SetUnencryptedHTTP2(true)
	srv := &http.Server{Addr: *listen, Handler: rp, Protocols: &sp}
	log.Printf("listening %s", *listen)
	log.Fatal(srv.ListenAndServe())
}

package idemproxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// BenchmarkClientWriter is the cost of the per-write deadlines on a real
// connection: a handler answering 64 bytes behind an http.Server, to a
// keep-alive client, with and without newClientWriter around its writer.
func BenchmarkClientWriter(b *testing.B) {
	body := make([]byte, 64)
	for _, tc := range []struct {
		name    string
		timeout time.Duration
	}{{"plain", 0}, {"deadlines", DefaultClientWriteTimeout}} {
		b.Run(tc.name, func(b *testing.B) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w = newClientWriter(w, tc.timeout)
				w.WriteHeader(http.StatusCreated)
				w.Write(body)
			}))
			defer srv.Close()
			client := srv.Client()
			b.ReportAllocs()
			for b.Loop() {
				resp, err := client.Get(srv.URL)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}

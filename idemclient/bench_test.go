package idemclient_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemclient"
)

// BenchmarkTransport measures what Transport adds to a POST answered at
// once over loopback: "base" is the bare http.Transport (the baseline),
// "idemclient" the same through Transport (a new UUIDv7 key, a clone of
// the request).
func BenchmarkTransport(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name string
		rt   func(base *http.Transport) http.RoundTripper
	}{
		{"base", func(base *http.Transport) http.RoundTripper { return base }},
		{"idemclient", func(base *http.Transport) http.RoundTripper {
			return &idemclient.Transport{Base: base, Logger: slog.New(slog.DiscardHandler)}
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			base := &http.Transport{MaxIdleConnsPerHost: 4}
			defer base.CloseIdleConnections()
			client := &http.Client{Transport: tc.rt(base)}
			b.ReportAllocs()
			for b.Loop() {
				resp, err := client.Post(srv.URL, "application/json", strings.NewReader(`{"amount":500}`))
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					b.Fatal(resp.Status)
				}
			}
		})
	}
}

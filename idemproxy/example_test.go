package idemproxy_test

import (
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
)

// New puts the proxy in front of an API in any language; here an httptest
// server that counts how often it charges.
func ExampleNew() {
	charges := 0
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d}`, charges)
	}))
	defer api.Close()

	store := idemmem.MustNew(idemmem.Config{})
	defer store.Close()
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}
	proxy, err := idemproxy.New(engine, idemproxy.Config{Upstream: api.URL}, idemproxy.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	front := httptest.NewServer(proxy)
	defer front.Close()

	for i := 0; i < 2; i++ {
		req, _ := http.NewRequest("POST", front.URL+"/charges", strings.NewReader(`{"amount":500}`))
		req.Header.Set("Authorization", "Bearer sk_test_123") // scopes the key; stored only as a hash
		req.Header.Set("Idempotency-Key", "charge-42")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotency-Outcome"), string(body))
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 acquired {"charge":1}
	// 201 replayed {"charge":1}
	// charges: 1
}

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

// NewKeyLimit caps the new keys each client may reserve: the second new
// key of the minute gets 429 and is not forwarded, while a retry of the
// first still replays, and another client is not affected.
func ExampleNewKeyLimit() {
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
	limit, err := idemproxy.ParseNewKeyLimit("1/1m") // as --new-keys-per-scope 1/1m
	if err != nil {
		log.Fatal(err)
	}
	cfg := idemproxy.Config{Upstream: api.URL, Settings: idemproxy.Settings{NewKeysPerScope: &limit}}
	proxy, err := idemproxy.New(engine, cfg, idemproxy.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	front := httptest.NewServer(proxy)
	defer front.Close()

	for _, call := range []struct{ client, key string }{
		{"sk_test_alice", "charge-1"},
		{"sk_test_alice", "charge-2"},
		{"sk_test_alice", "charge-1"},
		{"sk_test_bob", "charge-2"},
	} {
		req, _ := http.NewRequest("POST", front.URL+"/charges", strings.NewReader(`{"amount":500}`))
		req.Header.Set("Authorization", "Bearer "+call.client)
		req.Header.Set("Idempotency-Key", call.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		line := fmt.Sprint(call.client, " ", call.key, " ", resp.StatusCode, " ", resp.Header.Get("Idempotency-Outcome"))
		if resp.Header.Get("Retry-After") != "" {
			line += " (Retry-After)"
		}
		fmt.Println(line)
	}
	fmt.Println("charges:", charges)
	// Output:
	// sk_test_alice charge-1 201 acquired
	// sk_test_alice charge-2 429 too_many_new_keys (Retry-After)
	// sk_test_alice charge-1 201 replayed
	// sk_test_bob charge-2 201 acquired
	// charges: 2
}

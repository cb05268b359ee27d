package idemclient_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemclient"
	"github.com/idem-dev/idem/idemmem"
)

// Transport on the client, idem's middleware on the server: the client's
// key makes its retries safe, and the server's record gives every retry the
// first answer.
func ExampleTransport() {
	// The server: a payments API behind idem's middleware.
	store := idemmem.MustNew(idemmem.Config{})
	defer store.Close()
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}
	charges := 0
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d}`, charges)
	})
	srv := httptest.NewServer(idem.Middleware(engine, idem.Config{Scope: idem.GlobalScope})(api))
	defer srv.Close()

	// The client: every POST gets a key, kept across the Transport's
	// retries. To retry beyond it (the program restarted, the user clicked
	// again), keep the key and pass it with WithKey.
	client := &http.Client{Transport: &idemclient.Transport{}}
	ctx := idemclient.WithKey(context.Background(), idemclient.NewKey())
	for range 2 {
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/charges", strings.NewReader(`{"amount":500}`))
		resp, err := client.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", idemclient.Replayed(resp))
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 {"charge":1} replayed: false
	// 201 {"charge":1} replayed: true
	// charges: 1
}

// KeyFrom derives the key from what makes the operation unique, so that
// whoever retries it (another process, a job run again) sends the same key
// without having stored it.
func ExampleKeyFrom() {
	key := idemclient.KeyFrom("pay-invoice", "in_42")
	fmt.Println(key)
	fmt.Println(key == idemclient.KeyFrom("pay-invoice", "in_42"))
	fmt.Println(key == idemclient.KeyFrom("pay-invoice", "in_43"))
	// Output:
	// 84ca604c-ffdd-8a5f-89cd-d8e2d1ff8c22
	// true
	// false
}

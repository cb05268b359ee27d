package idemredis_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemredis"
)

// A store on a Redis Cluster guarding a payment, tried twice with the same
// key: the first attempt charges and stores the answer, the retry gets it
// back. rueidis finds out by itself whether InitAddress names Cluster nodes
// or a single node, so the same code works with one address; a redis://
// URL becomes a ClientOption with rueidis.ParseURL.
//
// It needs a Cluster (REDIS_ADDRS, such as
// 127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002), so go test compiles it
// without running it; TestExample runs it against the test Cluster. Its
// output is:
//
//	acquired: charging
//	replayed: 201 {"id":"pay_1"}
func ExampleNew() {
	ctx := context.Background()
	client, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: strings.Split(os.Getenv("REDIS_ADDRS"), ","),
	})
	if err != nil {
		log.Fatal(err) // rueidis connects at once
	}
	defer client.Close()

	store, err := idemredis.New(client, idemredis.Config{Prefix: "payments"})
	if err != nil {
		log.Fatal(err)
	}
	eng, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}

	key := idem.Key{Scope: "customer-42", Operation: "POST /payments", Key: rand.Text()}
	for range 2 { // the client's first attempt and its retry
		res, err := eng.Begin(ctx, idem.Request{Key: key, Fingerprint: "v1:…"})
		if err != nil {
			log.Fatal(err) // wraps idemstore.ErrUnavailable when Redis is down
		}
		switch res.Outcome {
		case idem.Acquired:
			fmt.Println("acquired: charging")
			// Charge the card, then store the answer for every retry.
			resp := &idem.Response{Status: http.StatusCreated, Body: []byte(`{"id":"pay_1"}`)}
			if err := res.Lease.Complete(ctx, resp); err != nil {
				log.Fatal(err)
			}
		case idem.Replayed:
			fmt.Println("replayed:", res.Response.Status, string(res.Response.Body))
		default:
			fmt.Println(res.Outcome)
		}
	}
}

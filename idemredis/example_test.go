package idemredis_test

import (
	"context"
	"fmt"
	"log"
	"net/http"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemredis"
)

// A store on a Redis Cluster guarding a payment. The same code works with
// redis.NewClient for a single node. (Not run by go test: it needs a
// Cluster.)
func ExampleNew() {
	ctx := context.Background()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"},
	})
	defer rdb.Close()

	store, err := idemredis.New(rdb, idemredis.Config{Prefix: "payments"})
	if err != nil {
		log.Fatal(err)
	}
	eng, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}

	key := idem.Key{Scope: "customer-42", Operation: "POST /payments", Key: "a1b2c3"}
	res, err := eng.Begin(ctx, idem.Request{Key: key, Fingerprint: "v1:…"})
	if err != nil {
		log.Fatal(err) // wraps idemstore.ErrUnavailable when Redis is down
	}
	switch res.Outcome {
	case idem.Acquired:
		// Charge the card, then store the answer for every retry.
		resp := &idem.Response{Status: http.StatusCreated, Body: []byte(`{"id":"pay_1"}`)}
		if err := res.Lease.Complete(ctx, resp); err != nil {
			log.Fatal(err)
		}
	case idem.Replayed:
		fmt.Println(res.Response.Status, string(res.Response.Body))
	default:
		fmt.Println(res.Outcome)
	}
}

package idemredis_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemredis"
)

// A store on a Redis Cluster guarding a payment, tried twice with the same
// key: the first attempt charges and stores the answer, the retry gets it
// back. The same code works with redis.NewClient for a single node.
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
	rdb := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: strings.Split(os.Getenv("REDIS_ADDRS"), ","),
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

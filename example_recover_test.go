package idem_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// Recover settles the keys of charges whose process died after sending
// them to a payment provider. A Resolver asks the provider, with the same
// idempotency key, what became of each: a charge it has is completed with
// its answer, one it never saw is released so that the retry runs it.
func ExampleEngine_Recover() {
	ctx := context.Background()
	// The store's clock decides when leases expire; here it is a clock
	// the example moves by hand.
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	store := idemmem.MustNew(idemmem.Config{Now: func() time.Time { return now }})
	defer store.Close()
	engine, err := idem.NewEngine(store, idem.EngineConfig{Lease: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	// What the provider recorded, by idempotency key: order-1's charge
	// went through, order-2's request never arrived.
	provider := map[string]string{"order-1": `{"charge":"ch_1"}`}

	request := func(key string) idem.Request {
		return idem.Request{Key: idem.Key{Scope: "shop-7", Operation: "charge", Key: key}, Fingerprint: "v1:…"}
	}
	for _, key := range []string{"order-1", "order-2"} {
		if _, err := engine.Begin(ctx, request(key)); err != nil { // acquired, then the process dies
			log.Fatal(err)
		}
	}
	now = now.Add(time.Minute) // the leases expire

	report, err := engine.Recover(ctx, idem.RecoverOptions{
		Resolver: idem.ResolverFunc(func(ctx context.Context, rec *idemstore.Record) (idem.Resolution, error) {
			if body, ok := provider[rec.Key.Key]; ok {
				return idem.Resolution{Verdict: idem.VerdictCompleted, Reason: "the provider has the charge",
					Response: &idem.Response{Status: http.StatusCreated, Body: []byte(body)}}, nil
			}
			return idem.Resolution{Verdict: idem.VerdictNotHappened, Reason: "the provider has no charge"}, nil
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("escalated %d, completed %d, reopened %d, left for a human %d\n",
		report.Escalated, report.Completed, report.Reopened, report.Unknown)

	for _, key := range []string{"order-1", "order-2"} { // the clients retry
		res, err := engine.Begin(ctx, request(key))
		if err != nil {
			log.Fatal(err)
		}
		switch res.Outcome {
		case idem.Replayed:
			fmt.Println(key, "replays", string(res.Response.Body))
		case idem.Acquired:
			fmt.Println(key, "runs again: it never happened")
			_ = res.Lease.Release(ctx)
		default:
			fmt.Println(key, res.Outcome)
		}
	}
	// Output:
	// escalated 2, completed 1, reopened 1, left for a human 0
	// order-1 replays {"charge":"ch_1"}
	// order-2 runs again: it never happened
}

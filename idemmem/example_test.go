package idemmem_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// The store-level protocol: the first Reserve wins the key, a retry gets the
// existing record back, and after Complete every retry replays the answer.
func Example() {
	store := idemmem.MustNew(idemmem.Config{})
	ctx := context.Background()
	key := idemstore.Key{Scope: "user:42", Operation: "POST /payments", Key: "order-1001"}

	// The first request reserves the key. A new record is not returned: it
	// is what the caller asked for.
	_, created, _ := store.Reserve(ctx, idemstore.ReserveParams{
		Key: key, Fingerprint: "v1:abc", Token: "lease-1", Lease: 30 * time.Second,
	})
	fmt.Println("first:", created)

	rec, created, _ := store.Reserve(ctx, idemstore.ReserveParams{
		Key: key, Fingerprint: "v1:abc", Token: "lease-2", Lease: 30 * time.Second,
	})
	fmt.Println("retry while running:", created, rec.State, rec.Token)

	_ = store.Complete(ctx, idemstore.CompleteParams{
		Key: key, Token: "lease-1", Retention: 24 * time.Hour,
		Response: &idemstore.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)},
	})
	rec, _, _ = store.Reserve(ctx, idemstore.ReserveParams{Key: key, Token: "lease-3", Lease: 30 * time.Second})
	fmt.Println("retry after completion:", rec.State, rec.Response.Status, string(rec.Response.Body))

	// The first holder's lease is spent: its token no longer changes anything.
	err := store.Release(ctx, idemstore.ReleaseParams{Key: key, Token: "lease-1"})
	fmt.Println("late release:", err)
	// Output:
	// first: true
	// retry while running: false pending lease-1
	// retry after completion: completed 201 {"id":"pay_1"}
	// late release: idem: lease lost
}

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
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	key := idemstore.Key{Scope: "user:42", Operation: "POST /payments", Key: "order-1001"}

	// The first request reserves the key. A new record is not returned: it
	// is what the caller asked for.
	_, created, _ := store.Reserve(ctx, idemstore.ReserveParams{
		Key: key, Fingerprint: "v1:abc", Token: "lease-1", LeaseUntil: now.Add(30 * time.Second), Now: now,
	})
	fmt.Println("first:", created)

	rec, created, _ := store.Reserve(ctx, idemstore.ReserveParams{
		Key: key, Fingerprint: "v1:abc", Token: "lease-2", LeaseUntil: now.Add(30 * time.Second), Now: now,
	})
	fmt.Println("retry while running:", created, rec.State, rec.Token)

	_ = store.Complete(ctx, idemstore.CompleteParams{
		Key: key, Token: "lease-1", Now: now, ExpiresAt: now.Add(24 * time.Hour),
		Response: &idemstore.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)},
	})
	rec, _, _ = store.Reserve(ctx, idemstore.ReserveParams{Key: key, Token: "lease-3", Now: now.Add(time.Minute)})
	fmt.Println("retry after completion:", rec.State, rec.Response.Status, string(rec.Response.Body))

	// The first holder's lease is spent: its token no longer changes anything.
	err := store.Release(ctx, key, "lease-1")
	fmt.Println("late release:", err)
	// Output:
	// first: true
	// retry while running: false pending lease-1
	// retry after completion: completed 201 {"id":"pay_1"}
	// late release: idem: lease lost
}

package idemsqlite_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

// Example opens a database file, reserves a key, completes it with the
// operation's answer, and reads the record back as a retry would.
func Example() {
	dir, err := os.MkdirTemp("", "idemsqlite-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	db, err := idemsqlite.Open(filepath.Join(dir, "idem.db"), idemsqlite.OpenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := idemsqlite.New(db, idemsqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	key := idemstore.Key{Scope: "user-42", Operation: "POST /payments", Key: "8e03978e-40d5"}

	_, created, err := store.Reserve(ctx, idemstore.ReserveParams{
		Key: key, Fingerprint: "sha256:abc", Token: "lease-1", Lease: 30 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("reserved:", created)

	// A retry arriving now finds the key taken.
	rec, created, err := store.Reserve(ctx, idemstore.ReserveParams{
		Key: key, Fingerprint: "sha256:abc", Token: "lease-2", Lease: 30 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("retry reserved:", created, rec.State)

	err = store.Complete(ctx, idemstore.CompleteParams{
		Key: key, Token: "lease-1", Retention: 24 * time.Hour,
		Response: &idemstore.Response{Status: 201, Body: []byte(`{"payment":"pay_1"}`)},
	})
	if err != nil {
		log.Fatal(err)
	}

	rec, err = store.Get(ctx, key)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("after complete:", rec.State, rec.Response.Status, string(rec.Response.Body))
	// Output:
	// reserved: true
	// retry reserved: false pending
	// after complete: completed 201 {"payment":"pay_1"}
}

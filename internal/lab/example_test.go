package lab_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idem-dev/idem/internal/lab"
)

// Run races the three strategies on a new SQLite file, which the lab
// removes afterwards. SQLite runs every transaction serializably, so no
// strategy lets a duplicate through there; on PostgreSQL and MySQL at
// READ COMMITTED, check-then-insert does.
func ExampleRun() {
	dir, _ := os.MkdirTemp("", "lab-example")
	defer os.RemoveAll(dir)
	rep, err := lab.Run(context.Background(), lab.Config{
		Store:       "sqlite://" + filepath.Join(dir, "lab.db"),
		Concurrency: 4,
		Rounds:      5,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, res := range rep.Results {
		fmt.Printf("%s at %s: %d rounds, at most %d execution per key, %d duplicates\n",
			res.Strategy, res.Isolation, res.Rounds, res.MaxExecutionsPerKey, res.Duplicates)
	}
	for _, sk := range rep.Skipped {
		fmt.Println("skipped", sk.Isolation)
	}
	// Output:
	// check-then-insert at serializable: 5 rounds, at most 1 execution per key, 0 duplicates
	// select-for-update at serializable: 5 rounds, at most 1 execution per key, 0 duplicates
	// insert-first at serializable: 5 rounds, at most 1 execution per key, 0 duplicates
	// skipped read-committed
	// skipped repeatable-read
}

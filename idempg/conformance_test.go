package idempg_test

import (
	"testing"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemstore/idemstoretest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	pool := testPool(t, "")
	idemstoretest.Exercise(t, idemstoretest.Harness{
		New: func(t *testing.T) idemstore.Store { return newStore(t, pool, idempg.Config{}) },
		Unavailable: func(t *testing.T) idemstore.Store {
			s, err := idempg.New(closedPortPool(t), idempg.Config{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
	})
}

// TestConcurrencyIsolationLevels races reservations with every session
// defaulting to each isolation level: the unique constraint must hold at all
// of them.
func TestConcurrencyIsolationLevels(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			pool := testPool(t, level)
			idemstoretest.ExerciseConcurrency(t, idemstoretest.Harness{
				New: func(t *testing.T) idemstore.Store { return newStore(t, pool, idempg.Config{}) },
			})
		})
	}
}

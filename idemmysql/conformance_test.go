package idemmysql_test

import (
	"testing"

	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemstore/idemstoretest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	idemstoretest.Exercise(t, idemstoretest.Harness{
		New: func(t *testing.T) idemstore.Store {
			s, _ := newStore(t, "")
			return s
		},
		Unavailable: func(t *testing.T) idemstore.Store {
			s, err := idemmysql.New(closedPortDB(t), idemmysql.Config{})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}

// TestConcurrencyIsolationLevels races reservations with sessions at
// REPEATABLE READ (InnoDB's default, where SELECT … FOR UPDATE designs
// deadlock on gap locks) and READ COMMITTED.
func TestConcurrencyIsolationLevels(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"REPEATABLE-READ", "READ-COMMITTED"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			idemstoretest.ExerciseConcurrency(t, idemstoretest.Harness{
				New: func(t *testing.T) idemstore.Store {
					s, db := newStore(t, level)
					var got string
					if err := db.QueryRowContext(t.Context(), "SELECT @@tx_isolation").Scan(&got); err != nil || got != level {
						t.Fatalf("session isolation = %q, %v; want %s", got, err, level)
					}
					return s
				},
			})
		})
	}
}

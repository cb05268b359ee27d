package idemredis

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemstore/idemstoretest"
)

func TestConformanceStandalone(t *testing.T) {
	t.Parallel()
	client := standaloneClient(t, 0)
	idemstoretest.Exercise(t, idemstoretest.Harness{
		New: func(t *testing.T) idemstore.Store { return newTestStore(t, client) },
		Unavailable: func(t *testing.T) idemstore.Store {
			c := redis.NewClient(&redis.Options{Addr: closedAddr(t), MaxRetries: -1})
			t.Cleanup(func() { _ = c.Close() })
			return newUncleanedStore(t, c)
		},
	})
}

func TestConformanceCluster(t *testing.T) {
	t.Parallel()
	client := clusterClient(t, 0)
	idemstoretest.Exercise(t, idemstoretest.Harness{
		New: func(t *testing.T) idemstore.Store { return newTestStore(t, client) },
		Unavailable: func(t *testing.T) idemstore.Store {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{closedAddr(t)}, MaxRetries: -1})
			t.Cleanup(func() { _ = c.Close() })
			return newUncleanedStore(t, c)
		},
	})
}

// TestConcurrencyCluster races reservations of keys spread over many slots
// (and so over every master) of the Cluster.
func TestConcurrencyCluster(t *testing.T) {
	t.Parallel()
	client := clusterClient(t, 0)
	idemstoretest.ExerciseConcurrency(t, idemstoretest.Harness{
		New: func(t *testing.T) idemstore.Store { return newTestStore(t, client) },
	})
}

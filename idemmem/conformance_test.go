package idemmem_test

import (
	"testing"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemstore/idemstoretest"
)

func harness() idemstoretest.Harness {
	return idemstoretest.Harness{
		New: func(t *testing.T) idemstore.Store {
			s := idemmem.MustNew(idemmem.Config{})
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Unavailable: func(t *testing.T) idemstore.Store {
			s := idemmem.MustNew(idemmem.Config{})
			_ = s.Close()
			return s
		},
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	idemstoretest.Exercise(t, harness())
}

func TestConformanceOneShard(t *testing.T) {
	t.Parallel()
	h := harness()
	h.New = func(t *testing.T) idemstore.Store {
		return idemmem.MustNew(idemmem.Config{Shards: 1})
	}
	idemstoretest.ExerciseConcurrency(t, h)
}

package idemadmin_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// wrappedCounter is a wrapper (a lazy or instrumented store) that always
// offers Counts, over a store that may not search.
type wrappedCounter struct {
	idemstore.Store
	search bool
}

func (w wrappedCounter) Capabilities() idemstore.Capabilities {
	c := w.Store.Capabilities()
	c.Search = w.search
	return c
}

func (w wrappedCounter) Counts(ctx context.Context) (idemstore.Counts, error) {
	if !w.search {
		return idemstore.Counts{}, fmt.Errorf("%w: the store does not count keys", idemstore.ErrSearchUnsupported)
	}
	return w.Store.(idemstore.Counter).Counts(ctx)
}

// TestCountsThroughAWrapper: the counts go through a wrapper that
// forwards them, and a wrapper over a store that cannot search answers
// not_supported (501), not a 500.
func TestCountsThroughAWrapper(t *testing.T) {
	t.Parallel()
	mem := idemmem.MustNew(idemmem.Config{})
	put(t, mem, "s", "order-1", idemstore.StateNeedsReview, "acct", "r")
	c, err := (&idemadmin.Keys{Store: wrappedCounter{mem, true}}).Counts(context.Background())
	if err != nil || c.NeedsReview != 1 {
		t.Fatalf("Counts = %+v, %v", c, err)
	}
	_, err = (&idemadmin.Keys{Store: wrappedCounter{mem, false}}).Counts(context.Background())
	requireCode(t, err, idemadmin.CodeNotSupported)
}

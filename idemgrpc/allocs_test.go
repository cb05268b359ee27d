package idemgrpc_test

import (
	"fmt"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// TestProtectedCallAllocations: a protected call on the memory store that
// reserves a new key and stores its answer allocates only what it keeps or
// hands on: the lease and its token, the record, its fingerprint and what
// it was made of, the stored answer and its encoding, and the recorder of
// the handler's metadata in its context; the handler allocates the answer
// message. Nothing per call builds the stored answer's header (a message
// without metadata shares one per type) or copies the fingerprinted bytes.
func TestProtectedCallAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	store := idemmem.MustNew(idemmem.Config{Shards: 1}) // its tables grow seldom
	defer store.Close()
	e, err := idem.NewEngine(store, idem.EngineConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	in, err := idemgrpc.NewUnaryServerInterceptor(e, idemgrpc.Config{Scope: idemgrpc.GlobalScope, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	charge := chargeDirect(in)
	const runs = 500
	reqs := make([]*testpb.ChargeRequest, runs+1)
	for i := range reqs {
		reqs[i] = &testpb.ChargeRequest{Account: "acc", Amount: 5, RequestId: fmt.Sprintf("0190a0e0-0000-7000-8000-%012d", i+1)}
	}
	i := 0
	allocs := testing.AllocsPerRun(runs, func() {
		if _, err := charge(reqs[i]); err != nil {
			t.Fatal(err)
		}
		i++
	})
	// lease, token, record, fingerprint, its source, answer message,
	// stored answer, its body, its encoding, recorder, context
	const want = 11
	if allocs > want {
		t.Errorf("a protected call allocates %v times, want at most %d", allocs, want)
	}
}

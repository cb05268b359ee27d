package idemgrpc_test

import (
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
	"github.com/idem-dev/idem/internal/testenv"
)

// TestNoSideEffectsUnprotected: a method marked idempotency_level =
// NO_SIDE_EFFECTS has no effect to run twice: idem leaves it alone even
// when its request carries a request_id, and naming it in the
// configuration is an error. Leaving it alone is deliberate, so nothing
// is logged.
func TestNoSideEffectsUnprotected(t *testing.T) {
	t.Parallel()
	var logs testenv.Buffer
	ev := newEnv(t, idemgrpc.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, envOptions{})
	for try := int64(1); try <= 2; try++ {
		var h metadata.MD
		p, err := ev.client.GetPayment(as("alice", uuid(1)), &testpb.GetPaymentRequest{Id: "pay_1", RequestId: uuid(1)}, grpc.Header(&h))
		if err != nil || p.Run != try || idemgrpc.Replayed(h) {
			t.Fatalf("try %d: %v %v %v", try, p, err, h)
		}
	}
	select {
	case e := <-ev.events:
		t.Fatalf("an unprotected call reported %+v", e)
	default:
	}
	if logs.String() != "" {
		t.Fatalf("logged: %s", logs.String())
	}
	e, err := idem.NewEngine(newMem(t), idem.EngineConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []idemgrpc.Config{
		{Scope: userScope, Methods: map[string]idemgrpc.Policy{getMethod: {}}},
		{Scope: userScope, Require: []string{getMethod}},
	} {
		if _, err := idemgrpc.NewUnaryServerInterceptor(e, cfg); err == nil || !strings.Contains(err.Error(), "NO_SIDE_EFFECTS") {
			t.Fatalf("%+v: %v", cfg, err)
		}
	}
}

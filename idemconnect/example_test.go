package idemconnect_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"connectrpc.com/connect"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemconnect"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
	"github.com/idem-dev/idem/internal/rpctest/testpb/testpbconnect"
)

type examplePayments struct {
	testpbconnect.UnimplementedPaymentsHandler
	runs int64
}

func (s *examplePayments) Charge(_ context.Context, req *connect.Request[testpb.ChargeRequest]) (*connect.Response[testpb.Payment], error) {
	s.runs++
	return connect.NewResponse(&testpb.Payment{Id: fmt.Sprintf("pay_%d", s.runs), Amount: req.Msg.Amount, Run: s.runs}), nil
}

// A handler protects its procedures with request_id fields; a client sends
// the same call twice with one key (WithKey), and the second gets the first
// answer, replayed, without the handler running again.
func ExampleNewInterceptor() {
	store := idemmem.MustNew(idemmem.Config{})
	defer store.Close()
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}
	icpt, err := idemconnect.NewInterceptor(engine, idemconnect.Config{Scope: idemconnect.GlobalScope})
	if err != nil {
		log.Fatal(err)
	}
	svc := &examplePayments{}
	mux := http.NewServeMux()
	mux.Handle(testpbconnect.NewPaymentsHandler(svc, connect.WithInterceptors(icpt)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	keys, err := idemconnect.NewClientInterceptor(idemconnect.ClientConfig{})
	if err != nil {
		log.Fatal(err)
	}
	client := testpbconnect.NewPaymentsClient(srv.Client(), srv.URL, connect.WithInterceptors(keys))
	for i := 0; i < 2; i++ {
		var info idemconnect.CallInfo
		ctx := idemconnect.WithCallInfo(idemconnect.WithKey(context.Background(), "0190a0e0-0000-7000-8000-000000000001"), &info)
		res, err := client.Charge(ctx, connect.NewRequest(&testpb.ChargeRequest{Account: "acc_1", Amount: 500}))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(res.Msg.Id, "replayed:", info.Replayed, "runs:", svc.runs)
	}
	// Output:
	// pay_1 replayed: false runs: 1
	// pay_1 replayed: true runs: 1
}

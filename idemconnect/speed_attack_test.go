package idemconnect_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemconnect"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
	"github.com/idem-dev/idem/internal/rpctest/testpb/testpbconnect"
)

// mixed answers Charge with a plain message (account "plain"), one with
// header and trailer metadata ("meta"), or an error with details ("err");
// Refund with metadata unless its charge is "plain".
type mixed struct {
	testpbconnect.UnimplementedPaymentsHandler
	runs atomic.Int64
}

func (p *mixed) Charge(_ context.Context, req *connect.Request[testpb.ChargeRequest]) (*connect.Response[testpb.Payment], error) {
	run := p.runs.Add(1)
	switch req.Msg.Account {
	case "meta":
		res := connect.NewResponse(&testpb.Payment{Id: req.Msg.RequestId, Run: run})
		res.Header().Set("X-H", req.Msg.RequestId)
		res.Trailer().Add("X-T", req.Msg.RequestId)
		res.Trailer().Add("X-T", "second")
		return res, nil
	case "err":
		e := connect.NewError(connect.CodeFailedPrecondition, errors.New("no "+req.Msg.RequestId))
		d, _ := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: "R", Domain: req.Msg.RequestId})
		e.AddDetail(d)
		e.Meta().Set("X-H", "err-"+req.Msg.RequestId)
		return nil, e
	}
	return connect.NewResponse(&testpb.Payment{Id: fmt.Sprint("pay_", run), Account: req.Msg.Account, Run: run}), nil
}

func (p *mixed) Refund(_ context.Context, req *connect.Request[testpb.RefundRequest]) (*connect.Response[testpb.RefundResult], error) {
	run := p.runs.Add(1)
	res := connect.NewResponse(&testpb.RefundResult{Id: fmt.Sprint("ref_", run), Run: run})
	if req.Msg.Charge != "plain" {
		res.Header().Set("X-R", req.Msg.Charge)
		res.Trailer().Set("X-Rt", req.Msg.Charge)
	}
	return res, nil
}

// TestReplaysCarryTheirOwnMetadata: calls of two procedures and message
// types run at once over Connect, gRPC and gRPC-Web, some answering a
// plain message (whose stored header is shared per message type), some
// with header and trailer metadata, some with an error and its details.
// Every retry replays exactly its own first answer, with its own metadata
// and none of another call's, and Idempotent-Replayed, which no first call
// carries.
func TestReplaysCarryTheirOwnMetadata(t *testing.T) {
	t.Parallel()
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	e, err := idem.NewEngine(store, idem.EngineConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	icpt, err := idemconnect.NewInterceptor(e, idemconnect.Config{Scope: userScope, Logger: quiet,
		Methods: map[string]idemconnect.Policy{testpbconnect.PaymentsRefundProcedure: {}}})
	if err != nil {
		t.Fatal(err)
	}
	svc := &mixed{}
	mux := http.NewServeMux()
	mux.Handle(testpbconnect.NewPaymentsHandler(svc, connect.WithInterceptors(icpt)))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	clients := []testpbconnect.PaymentsClient{
		testpbconnect.NewPaymentsClient(srv.Client(), srv.URL),
		testpbconnect.NewPaymentsClient(srv.Client(), srv.URL, connect.WithGRPC()),
		testpbconnect.NewPaymentsClient(srv.Client(), srv.URL, connect.WithGRPCWeb()),
	}

	type answer struct {
		msg             proto.Message
		code            connect.Code
		msgText         string
		details         []string
		header, trailer http.Header
		replayed        bool
	}
	own := func(h http.Header) http.Header { // the handlers' own metadata
		out := http.Header{}
		for k, v := range h {
			if strings.HasPrefix(k, "X-") {
				out[k] = v
			}
		}
		return out
	}
	call := func(i, attempt int) answer {
		c := clients[(i+attempt)%len(clients)]
		key := fmt.Sprintf("0190a0e0-0000-7000-8000-%012d", i)
		var a answer
		var err error
		var h, tr http.Header
		switch i % 5 {
		case 0, 1, 2:
			req := connect.NewRequest(&testpb.ChargeRequest{Account: []string{"plain", "meta", "err"}[i%5], RequestId: key})
			req.Header().Set("X-User", "alice")
			var res *connect.Response[testpb.Payment]
			if res, err = c.Charge(context.Background(), req); err == nil {
				a.msg, h, tr = res.Msg, res.Header(), res.Trailer()
			}
		default:
			charge := fmt.Sprint("c", i)
			if i%5 == 4 {
				charge = "plain"
			}
			req := connect.NewRequest(&testpb.RefundRequest{Charge: charge})
			req.Header().Set("X-User", "alice")
			req.Header().Set("Idempotency-Key", key)
			var res *connect.Response[testpb.RefundResult]
			if res, err = c.Refund(context.Background(), req); err == nil {
				a.msg, h, tr = res.Msg, res.Header(), res.Trailer()
			}
		}
		var ce *connect.Error
		if errors.As(err, &ce) {
			a.code, a.msgText, h = ce.Code(), ce.Message(), ce.Meta()
			for _, d := range ce.Details() {
				v, _ := d.Value()
				a.details = append(a.details, fmt.Sprint(v))
			}
		} else if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
		a.header, a.trailer, a.replayed = own(h), own(tr), idemconnect.Replayed(h)
		return a
	}
	const calls = 30
	first := make([]answer, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() { first[i] = call(i, 0) })
	}
	wg.Wait()
	again := make([][2]answer, calls)
	for i := range calls {
		for j := range 2 {
			wg.Go(func() { again[i][j] = call(i, j+1) })
		}
	}
	wg.Wait()
	for i, f := range first {
		// The answers are what the handlers made: the test covers each kind.
		switch i % 5 {
		case 0, 4:
			if len(f.header) != 0 || len(f.trailer) != 0 || f.msg == nil {
				t.Errorf("call %d, a plain answer: %v, header %v trailer %v", i, f.msg, f.header, f.trailer)
			}
		case 1:
			if len(f.header["X-H"]) != 1 || len(f.trailer["X-T"]) != 2 {
				t.Errorf("call %d, with metadata: header %v trailer %v", i, f.header, f.trailer)
			}
		case 2:
			if f.code != connect.CodeFailedPrecondition || len(f.details) != 1 || len(f.header["X-H"]) != 1 {
				t.Errorf("call %d, an error: %v %v header %v", i, f.code, f.details, f.header)
			}
		}
		if f.replayed {
			t.Errorf("call %d: the first call says it was replayed", i)
		}
		for _, r := range again[i] {
			if !r.replayed {
				t.Errorf("call %d: a retry does not say it was replayed", i)
			}
			if !proto.Equal(f.msg, r.msg) || f.code != r.code || f.msgText != r.msgText || fmt.Sprint(f.details) != fmt.Sprint(r.details) {
				t.Errorf("call %d: first %v %v %q %v, replayed %v %v %q %v", i, f.msg, f.code, f.msgText, f.details, r.msg, r.code, r.msgText, r.details)
			}
			// gRPC-Web and Connect carry trailers differently; what the
			// handler set must come back under the same names.
			if fmt.Sprint(f.header) != fmt.Sprint(r.header) || fmt.Sprint(f.trailer) != fmt.Sprint(r.trailer) {
				t.Errorf("call %d: first header %v trailer %v, replayed header %v trailer %v", i, f.header, f.trailer, r.header, r.trailer)
			}
		}
	}
	if n := svc.runs.Load(); n != calls {
		t.Errorf("handlers ran %d times for %d keys", n, calls)
	}
}

package frontdoors_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemconnect"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
	"github.com/idem-dev/idem/internal/rpctest/testpb/testpbconnect"
)

var quiet = slog.New(slog.DiscardHandler)

// What a front door's answer means, the same in every protocol.
const (
	ran         = "ran"         // the handler ran; its answer
	replayed    = "replayed"    // the first answer, marked replayed
	reused      = "reused"      // the key was used with another request
	inFlight    = "in_flight"   // the first call still runs; retry later
	failed      = "failed"      // the handler's own failure
	review      = "review"      // the key waits for review
	unavailable = "unavailable" // the store is down; nothing ran
)

// behaviour is what the handler does, by account: block until released,
// fail once with "nothing happened" (503, UNAVAILABLE), fail ambiguously.
type behaviour struct {
	runs    atomic.Int64
	entered chan struct{}
	release chan struct{}
	mu      sync.Mutex
	tries   map[string]int
}

// act runs the handler's logic and returns what happened: "" for success,
// or "release" / "ambiguous".
func (b *behaviour) act(account string) (run int64, fail string) {
	run = b.runs.Add(1)
	b.mu.Lock()
	b.tries[account]++
	n := b.tries[account]
	b.mu.Unlock()
	switch {
	case account == "block":
		b.entered <- struct{}{}
		<-b.release
	case account == "flaky" && n == 1:
		return run, "release"
	case account == "ambiguous":
		return run, "ambiguous"
	}
	return run, ""
}

// door is one front door over its own engine and store.
type door struct {
	name string
	b    *behaviour
	down *atomic.Bool // the store fails while set
	call func(key, account string, amount int64) string
}

// downStore fails every Reserve while down is set.
type downStore struct {
	idemstore.Store
	down *atomic.Bool
}

func (s downStore) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	if s.down.Load() {
		return nil, false, fmt.Errorf("down: %w", idemstore.ErrUnavailable)
	}
	return s.Store.Reserve(ctx, p)
}

func newEngine(t *testing.T) (*idem.Engine, *atomic.Bool) {
	mem := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { mem.Close() })
	down := new(atomic.Bool)
	e, err := idem.NewEngine(downStore{mem, down}, idem.EngineConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return e, down
}

func newBehaviour() *behaviour {
	return &behaviour{entered: make(chan struct{}), release: make(chan struct{}), tries: map[string]int{}}
}

// httpDoor: the middleware on net/http; a handler that fails ambiguously
// panics (a recoverer outside answers 500).
func httpDoor(t *testing.T) *door {
	e, down := newEngine(t)
	d := &door{name: "http", b: newBehaviour(), down: down}
	mw := idem.Middleware(e, idem.Config{Scope: func(r *http.Request) (string, error) { return "user:" + r.Header.Get("X-User"), nil }, Logger: quiet})
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Account string }
		json.NewDecoder(r.Body).Decode(&req)
		run, fail := d.b.act(req.Account)
		switch fail {
		case "release":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "ambiguous":
			panic("provider timed out")
		default:
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"run":%d}`, run)
		}
	}))
	recoverer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if recover() != nil {
				w.WriteHeader(http.StatusInternalServerError)
			}
		}()
		h.ServeHTTP(w, r)
	})
	srv := httptest.NewServer(recoverer)
	t.Cleanup(srv.Close)
	d.call = func(key, account string, amount int64) string {
		req, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader(fmt.Sprintf(`{"account":%q,"amount":%d}`, account, amount)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User", "alice")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch outcome := resp.Header.Get("Idempotency-Outcome"); {
		case resp.Header.Get("Idempotent-Replayed") == "true":
			return replayed
		case resp.StatusCode == 201:
			return ran
		case resp.StatusCode == 422:
			return reused
		case outcome == "in_flight" && resp.StatusCode == 409 && resp.Header.Get("Retry-After") != "":
			return inFlight
		case outcome == "needs_review" && resp.StatusCode == 409:
			return review
		case outcome == "unavailable" && resp.StatusCode == 503:
			return unavailable
		case resp.StatusCode >= 500:
			return failed
		default:
			return fmt.Sprintf("HTTP %d %s", resp.StatusCode, outcome)
		}
	}
	return d
}

// rpcVerdict reads a gRPC or Connect answer: its code, idem's reason, and
// the replayed header.
func rpcVerdict(c codes.Code, reason string, retryInfo, isReplay bool) string {
	switch {
	case c == codes.OK && isReplay:
		return replayed
	case c == codes.OK:
		return ran
	case c == codes.FailedPrecondition && reason == idemgrpc.ReasonKeyReused:
		return reused
	case c == codes.Aborted && reason == idemgrpc.ReasonInFlight && retryInfo:
		return inFlight
	case c == codes.FailedPrecondition && reason == idemgrpc.ReasonNeedsReview:
		return review
	case c == codes.Unavailable && reason == idemgrpc.ReasonStoreUnavailable && retryInfo:
		return unavailable
	case reason == "" && (c == codes.Unavailable || c == codes.Internal || c == codes.DeadlineExceeded):
		return failed
	}
	return fmt.Sprintf("%v %s", c, reason)
}

// rpcCharge is the Charge handler of both RPC doors.
// newErr makes an error of the door's framework.
func rpcCharge(b *behaviour, req *testpb.ChargeRequest, newErr func(codes.Code, string) error) (*testpb.Payment, error) {
	run, fail := b.act(req.Account)
	switch fail {
	case "release":
		return nil, newErr(codes.Unavailable, "busy")
	case "ambiguous":
		return nil, idem.Ambiguous(newErr(codes.Internal, "provider timed out"))
	}
	return &testpb.Payment{Run: run}, nil
}

type grpcPayments struct {
	testpb.UnimplementedPaymentsServer
	b *behaviour
}

func (p grpcPayments) Charge(_ context.Context, req *testpb.ChargeRequest) (*testpb.Payment, error) {
	return rpcCharge(p.b, req, status.Error)
}

func grpcDoor(t *testing.T) *door {
	e, down := newEngine(t)
	d := &door{name: "grpc", b: newBehaviour(), down: down}
	scope := func(ctx context.Context) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		return "user:" + md.Get("x-user")[0], nil
	}
	s := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(e, idemgrpc.Config{Scope: scope, Logger: quiet})))
	testpb.RegisterPaymentsServer(s, grpcPayments{b: d.b})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := testpb.NewPaymentsClient(conn)
	d.call = func(key, account string, amount int64) string {
		var hdr metadata.MD
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-user", "alice", "idempotency-key", key)
		_, err := c.Charge(ctx, &testpb.ChargeRequest{Account: account, Amount: amount}, grpc.Header(&hdr))
		_, retry := idemgrpc.RetryDelay(err)
		return rpcVerdict(status.Code(err), idemgrpc.Reason(err), retry, idemgrpc.Replayed(hdr))
	}
	return d
}

type connectPayments struct {
	testpbconnect.UnimplementedPaymentsHandler
	b *behaviour
}

func (p connectPayments) Charge(_ context.Context, req *connect.Request[testpb.ChargeRequest]) (*connect.Response[testpb.Payment], error) {
	res, err := rpcCharge(p.b, req.Msg, func(c codes.Code, msg string) error { return connect.NewError(connect.Code(c), errors.New(msg)) })
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

func connectDoor(t *testing.T) *door {
	e, down := newEngine(t)
	d := &door{name: "connect", b: newBehaviour(), down: down}
	scope := func(ctx context.Context) (string, error) {
		info, _ := connect.CallInfoForHandlerContext(ctx)
		return "user:" + info.RequestHeader().Get("X-User"), nil
	}
	icpt, err := idemconnect.NewInterceptor(e, idemconnect.Config{Scope: scope, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(testpbconnect.NewPaymentsHandler(connectPayments{b: d.b}, connect.WithInterceptors(icpt)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c := testpbconnect.NewPaymentsClient(srv.Client(), srv.URL)
	d.call = func(key, account string, amount int64) string {
		req := connect.NewRequest(&testpb.ChargeRequest{Account: account, Amount: amount})
		req.Header().Set("X-User", "alice")
		req.Header().Set("Idempotency-Key", key)
		res, err := c.Charge(context.Background(), req)
		var ce *connect.Error
		hdr := http.Header{}
		if errors.As(err, &ce) {
			hdr = ce.Meta()
		} else if res != nil {
			hdr = res.Header()
		}
		c := codes.OK
		if err != nil {
			c = codes.Code(connect.CodeOf(err))
		}
		return rpcVerdict(c, idemconnect.Reason(err), hasRetryInfo(ce), idemconnect.Replayed(hdr))
	}
	return d
}

func hasRetryInfo(ce *connect.Error) bool {
	if ce == nil {
		return false
	}
	for _, d := range ce.Details() {
		if d.Type() == "google.rpc.RetryInfo" {
			return true
		}
	}
	return false
}

// TestOutcomesAcrossFrontDoors drives the same scenarios through the HTTP
// middleware, the gRPC interceptor, the Connect interceptor and idem serve
// in front of a plain gRPC server (a gRPC client over h2c), and checks
// that each gives the matching answer: 201/OK, the replay, 422/KEY_REUSED,
// 409+Retry-After/ABORTED+RetryInfo, a failure released and run again, an
// ambiguous failure sent to review (409 needs-review/NEEDS_REVIEW), and a
// store that is down (503/UNAVAILABLE, nothing run).
func TestOutcomesAcrossFrontDoors(t *testing.T) {
	t.Parallel()
	scenarios := []struct {
		name  string
		steps func(d *door) []string
		want  []string
		runs  int64
	}{
		{"first call, then replay", func(d *door) []string {
			return []string{d.call("k1", "a", 5), d.call("k1", "a", 5)}
		}, []string{ran, replayed}, 1},
		{"reuse with another request", func(d *door) []string {
			return []string{d.call("k2", "a", 5), d.call("k2", "a", 6)}
		}, []string{ran, reused}, 1},
		{"duplicate in flight", func(d *door) []string {
			first := make(chan string)
			go func() { first <- d.call("k3", "block", 5) }()
			<-d.b.entered
			dup := d.call("k3", "block", 5)
			close(d.b.release)
			return []string{<-first, dup, d.call("k3", "block", 5)}
		}, []string{ran, inFlight, replayed}, 1},
		{"failure then retry", func(d *door) []string {
			return []string{d.call("k4", "flaky", 5), d.call("k4", "flaky", 5), d.call("k4", "flaky", 5)}
		}, []string{failed, ran, replayed}, 2},
		{"ambiguous failure then review", func(d *door) []string {
			return []string{d.call("k5", "ambiguous", 5), d.call("k5", "ambiguous", 5)}
		}, []string{failed, review}, 1},
		{"store down", func(d *door) []string {
			d.down.Store(true)
			defer d.down.Store(false)
			return []string{d.call("k6", "a", 5)}
		}, []string{unavailable}, 0},
	}
	for _, mk := range []func(*testing.T) *door{httpDoor, grpcDoor, connectDoor, proxyDoor} {
		for _, sc := range scenarios {
			d := mk(t)
			t.Run(d.name+"/"+sc.name, func(t *testing.T) {
				got := sc.steps(d)
				if strings.Join(got, " ") != strings.Join(sc.want, " ") {
					t.Errorf("answers %v, want %v", got, sc.want)
				}
				if n := d.b.runs.Load(); n != sc.runs {
					t.Errorf("the handler ran %d times, want %d", n, sc.runs)
				}
			})
		}
	}
}

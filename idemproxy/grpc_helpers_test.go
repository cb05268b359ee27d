package idemproxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
	"github.com/idem-dev/idem/internal/rpctest/testpb/testpbconnect"
)

// payments is an upstream gRPC service (connect-go, so it speaks gRPC,
// gRPC-Web and Connect), whose behaviour is chosen by the account:
//
//   - "declined": FAILED_PRECONDITION with an ErrorInfo and a trailer;
//   - "flaky": UNAVAILABLE at the first run, then a payment;
//   - "ambiguous": DEADLINE_EXCEEDED;
//   - "block": waits on release (after a send on entered);
//   - "reset": sends its headers, then resets the stream;
//   - anything else: a payment, with header and trailer metadata.
type payments struct {
	testpbconnect.UnimplementedPaymentsHandler
	mu      sync.Mutex
	runs    map[string]int
	total   atomic.Int64
	entered chan struct{}
	release chan struct{}
	timeout atomic.Value // the grpc-timeout of the last Charge, a string
}

func newPayments() *payments {
	return &payments{runs: map[string]int{}, entered: make(chan struct{}, 64), release: make(chan struct{})}
}

func (p *payments) run(account string) int {
	p.total.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.runs[account]++
	return p.runs[account]
}

func (p *payments) runsOf(account string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.runs[account]
}

func (p *payments) Charge(_ context.Context, req *connect.Request[testpb.ChargeRequest]) (*connect.Response[testpb.Payment], error) {
	acct := req.Msg.GetAccount()
	p.timeout.Store(req.Header().Get("Grpc-Timeout"))
	n := p.run(acct)
	switch {
	case acct == "declined":
		e := connect.NewError(connect.CodeFailedPrecondition, errors.New("card declined"))
		if d, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: "DECLINED", Domain: "pay.example"}); err == nil {
			e.AddDetail(d)
		}
		e.Meta().Set("X-Decline", "card")
		return nil, e
	case acct == "flaky" && n == 1:
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("try again"))
	case acct == "ambiguous":
		return nil, connect.NewError(connect.CodeDeadlineExceeded, errors.New("the ledger timed out"))
	case acct == "block":
		p.entered <- struct{}{}
		<-p.release
	}
	res := connect.NewResponse(&testpb.Payment{Id: "p-" + acct, Account: acct, Amount: req.Msg.GetAmount(), Run: int64(n)})
	res.Header().Set("X-Charge", "yes")
	res.Trailer().Set("X-Ledger", "entry-"+strconv.Itoa(n))
	if req.Header().Get("X-Test-Fat-Trailer") != "" {
		// 2 MiB of trailers, past the 1 MiB bound on stored answers.
		for i := range 64 {
			res.Trailer().Set("X-Fat-"+strconv.Itoa(i), strings.Repeat("f", 32<<10))
		}
	}
	return res, nil
}

func (p *payments) Ship(_ context.Context, req *connect.Request[testpb.ShipRequest]) (*connect.Response[testpb.Shipment], error) {
	n := p.run("ship")
	return connect.NewResponse(&testpb.Shipment{Id: "s", Order: req.Msg.GetOrder(), Run: int64(n)}), nil
}

func (p *payments) Watch(_ context.Context, req *connect.Request[testpb.WatchRequest], s *connect.ServerStream[testpb.Event]) error {
	p.run("watch")
	for i := range 3 {
		if err := s.Send(&testpb.Event{Id: req.Msg.GetAccount() + strconv.Itoa(i)}); err != nil {
			return err
		}
	}
	return nil
}

// resetAfterHeaders makes calls with the x-test-reset metadata run, send
// their headers, and reset the stream: an upstream that fails after it
// had the call.
func (p *payments) handler() http.Handler {
	_, h := testpbconnect.NewPaymentsHandler(p)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/plain/") {
			p.run("plain " + r.Method + " " + r.URL.Path + " " + r.Header.Get("X-Forwarded-Host"))
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "ok")
			return
		}
		if r.Header.Get("X-Test-No-Status") != "" {
			// A message, then the end of the stream without trailers.
			p.run("nostatus")
			w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
			w.WriteHeader(http.StatusOK)
			w.Write([]byte{0, 0, 0, 0, 0})
			return
		}
		if r.Header.Get("X-Test-Reset") != "" {
			p.run("reset")
			w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
			w.WriteHeader(http.StatusOK)
			http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		}
		h.ServeHTTP(w, r)
	})
}

// startUpstream serves p on a cleartext listener that speaks HTTP/1.1 and
// h2c.
func startUpstream(t *testing.T, p *payments) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: p.handler(), Protocols: &protos, ErrorLog: quietLog()}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func quietLog() *log.Logger { return slog.NewLogLogger(slog.DiscardHandler, slog.LevelError) }

// descriptorSet writes testpb's FileDescriptorSet (with its imports) to a
// file, as protoc --include_imports --descriptor_set_out would.
func descriptorSet(t *testing.T) string {
	t.Helper()
	var set descriptorpb.FileDescriptorSet
	seen := map[string]bool{}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imps := fd.Imports()
		for i := range imps.Len() {
			add(imps.Get(i).FileDescriptor)
		}
		set.File = append(set.File, protodesc.ToFileDescriptorProto(fd))
	}
	add(testpb.File_payments_proto)
	b, err := proto.Marshal(&set)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "payments.binpb")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// rpcEnv is idem serve in front of a payments upstream.
type rpcEnv struct {
	pay    *payments
	addr   string // idem serve's
	admin  string
	srv    *idemproxy.Server
	store  idemstore.Store
	down   *atomic.Bool
	slow   *atomic.Int64 // how far each Reserve moves the proxy's clock, in nanoseconds
	lease  *atomic.Int64 // of the last reservation
	cancel context.CancelFunc
}

// startRPC runs idem serve (yaml added to its configuration) in front of
// a payments upstream reached over h2c.
func startRPC(t *testing.T, yaml string) *rpcEnv {
	t.Helper()
	env := &rpcEnv{pay: newPayments()}
	up := startUpstream(t, env.pay)
	return env.start(t, "upstream: h2c://"+up+"\n"+yaml)
}

// start runs idem serve with yaml, which names the upstream.
func (env *rpcEnv) start(t *testing.T, yaml string) *rpcEnv {
	t.Helper()
	env.down = new(atomic.Bool)
	mem := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { mem.Close() })
	env.lease = new(atomic.Int64)
	env.slow = new(atomic.Int64)
	ahead := new(atomic.Int64) // how far the proxy's clock is ahead of time.Now
	env.store = downStore{Store: mem, down: env.down, slow: env.slow, ahead: ahead, lease: env.lease}
	if !strings.Contains(yaml, "wait:") {
		yaml += "wait: 5s\n"
	}
	cfg, err := idemproxy.ParseConfig([]byte("listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nanonymous: shared\n" + yaml))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("IDEM_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	env.srv = &idemproxy.Server{Config: cfg, Store: env.store, Logger: log,
		Now: func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }}
	type addrs struct{ proxy, admin net.Addr }
	ready := make(chan addrs, 1)
	env.srv.Ready = func(p, a net.Addr) { ready <- addrs{p, a} }
	ctx, cancel := context.WithCancel(context.Background())
	env.cancel = cancel
	done := make(chan error, 1)
	go func() { done <- env.srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case a := <-ready:
		env.addr, env.admin = a.proxy.String(), a.admin.String()
	case err := <-done:
		t.Fatalf("idem serve: %v", err)
	}
	return env
}

// downStore fails every Reserve while down is set, moves the proxy's
// clock (ahead) by slow for each, as a store far away would take, and notes
// the lease of the last one once it is done.
type downStore struct {
	idemstore.Store
	down  *atomic.Bool
	slow  *atomic.Int64
	ahead *atomic.Int64
	lease *atomic.Int64
}

func (s downStore) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	s.ahead.Add(s.slow.Load())
	if s.down.Load() {
		s.lease.Store(int64(p.Lease))
		return nil, false, fmt.Errorf("down: %w", idemstore.ErrUnavailable)
	}
	rec, ok, err := s.Store.Reserve(ctx, p)
	s.lease.Store(int64(p.Lease)) // once the reservation is done
	return rec, ok, err
}

// grpcClient is a grpc-go client of idem serve, over h2c.
func (env *rpcEnv) grpcClient(t *testing.T, opts ...grpc.DialOption) testpb.PaymentsClient {
	t.Helper()
	cc, err := grpc.NewClient(env.addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return testpb.NewPaymentsClient(cc)
}

// connectClient is a Connect client (or gRPC-Web, with
// connect.WithGRPCWeb) of idem serve over HTTP/1.1.
func (env *rpcEnv) connectClient(t *testing.T, opts ...connect.ClientOption) testpbconnect.PaymentsClient {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	return testpbconnect.NewPaymentsClient(hc, "http://"+env.addr, opts...)
}

// metric returns the sum of the samples of the metric name whose labels
// contain every one of labels.
func (env *rpcEnv) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + env.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = io.Copy(&b, resp.Body)
	sum := 0.0
	for line := range strings.SplitSeq(b.String(), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		sum += v
	}
	return sum
}

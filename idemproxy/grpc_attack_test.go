package idemproxy_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// TestGRPCAnswerWithoutStatusGoesToReview: an upstream that sends its
// headers and a message and ends the stream without trailers gave no
// status: the call ran with an unknown outcome, and is never stored as
// an answer without grpc-status.
func TestGRPCAnswerWithoutStatusGoesToReview(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "")
	c := env.grpcClient(t)
	ctx := metadata.AppendToOutgoingContext(keyed("ns"), "x-test-no-status", "1")
	for i, want := range []string{"UPSTREAM_FAILED", "NEEDS_REVIEW"} {
		if _, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "x"}); reasonOf(err) != want {
			t.Errorf("call %d: %v, want %s", i, err, want)
		}
	}
	if n := env.pay.runsOf("nostatus"); n != 1 {
		t.Errorf("the upstream ran %d times", n)
	}
}

// TestGRPCOversizedMessageRefused: a request message over max_body is
// refused (RESOURCE_EXHAUSTED) before anything is forwarded; so is one
// whose gzip expands past it.
func TestGRPCOversizedMessageRefused(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "max_body: 4096\nproto_descriptor_set: "+descriptorSet(t)+"\n")
	c := env.grpcClient(t)
	big := &testpb.ChargeRequest{Account: "big", Note: make([]byte, 8192)}
	if _, err := c.Charge(keyed("big"), big); status.Code(err) != codes.ResourceExhausted || reasonOf(err) != "MESSAGE_TOO_LARGE" {
		t.Errorf("oversized: %v", err)
	}
	if _, err := c.Charge(keyed("big-gz"), big, grpc.UseCompressor(gzip.Name)); reasonOf(err) == "" || status.Code(err) == codes.OK {
		t.Errorf("oversized once decompressed: %v", err)
	}
	if n := env.pay.runsOf("big"); n != 0 {
		t.Errorf("the upstream ran %d times", n)
	}
}

// TestGRPCCompressedMessages: with descriptors, a gzip-compressed call
// and its uncompressed retry are one request; a compression idem cannot
// read is refused (UNIMPLEMENTED), not fingerprinted by bytes that differ
// from one try to the next.
func TestGRPCCompressedMessages(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "proto_descriptor_set: "+descriptorSet(t)+"\n")
	c := env.grpcClient(t)
	req := &testpb.ChargeRequest{Account: "gz", Amount: 3, Note: bytes.Repeat([]byte("a"), 512)}
	p1, err := c.Charge(keyed("gz"), req, grpc.UseCompressor(gzip.Name))
	if err != nil {
		t.Fatal(err)
	}
	var hdr metadata.MD
	p2, err := c.Charge(keyed("gz"), req, grpc.Header(&hdr))
	if err != nil || p1.GetRun() != 1 || p2.GetRun() != 1 || len(hdr.Get("idempotent-replayed")) != 1 {
		t.Errorf("gzip then plain: %v %v %v", p1, p2, err)
	}
	_, err = c.Charge(keyed("odd"), &testpb.ChargeRequest{Account: "odd"}, grpc.UseCompressor(oddCompressor{}.Name()))
	if status.Code(err) != codes.Unimplemented || env.pay.runsOf("odd") != 0 {
		t.Errorf("an unknown compression: %v", err)
	}
}

// oddCompressor is a compression idem does not read.
type oddCompressor struct{}

func (oddCompressor) Compress(w io.Writer) (io.WriteCloser, error) { return nopWriteCloser{w}, nil }
func (oddCompressor) Decompress(r io.Reader) (io.Reader, error)    { return r, nil }
func (oddCompressor) Name() string                                 { return "idem-test-odd" }

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

func init() { encoding.RegisterCompressor(oddCompressor{}) }

// TestGRPCHugeMetadataRefused: a call whose header list is over
// max_header_bytes never reaches the upstream.
func TestGRPCHugeMetadataRefused(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "max_header_bytes: 8192\n")
	c := env.grpcClient(t)
	ctx := metadata.AppendToOutgoingContext(keyed("huge"), "x-huge", strings.Repeat("h", 64<<10))
	if _, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "huge"}); err == nil {
		t.Error("a call with 64 KiB of metadata was answered")
	}
	if n := env.pay.runsOf("huge"); n != 0 {
		t.Errorf("the upstream ran %d times", n)
	}
	if _, err := c.Charge(keyed("small"), &testpb.ChargeRequest{Account: "small"}); err != nil {
		t.Errorf("the next call on the connection: %v", err)
	}
}

// TestGRPCTimeoutBoundsTheWait: a duplicate whose grpc-timeout is shorter
// than the route's wait gets ABORTED (IN_FLIGHT) while it can still hear
// it, not its own DEADLINE_EXCEEDED.
func TestGRPCTimeoutBoundsTheWait(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "wait: 1m\n")
	c := env.grpcClient(t)
	first := make(chan error, 1)
	go func() {
		_, err := c.Charge(keyed("tw"), &testpb.ChargeRequest{Account: "block"})
		first <- err
	}()
	<-env.pay.entered
	ctx, cancel := context.WithTimeout(keyed("tw"), 2*time.Second)
	defer cancel()
	_, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "block"})
	close(env.pay.release)
	if status.Code(err) != codes.Aborted || reasonOf(err) != "IN_FLIGHT" {
		t.Errorf("a duplicate with a deadline: %v", err)
	}
	if err := <-first; err != nil {
		t.Error(err)
	}
}

// TestGRPCTimeoutBoundsTheLease: a call with a deadline reserves its key
// for about as long as it may run, not for the route's whole lease, so
// that a proxy that dies during it leaves a key that recovery settles
// soon after.
func TestGRPCTimeoutBoundsTheLease(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "lease: 10m\n")
	c := env.grpcClient(t)
	ctx, cancel := context.WithTimeout(keyed("tl"), time.Minute)
	defer cancel()
	if _, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "tl"}); err != nil {
		t.Fatal(err)
	}
	if got := time.Duration(env.lease.Load()); got > 2*time.Minute || got < time.Minute {
		t.Errorf("a call with a minute to run reserved its key for %v", got)
	}
	if _, err := c.Charge(keyed("tl2"), &testpb.ChargeRequest{Account: "tl"}); err != nil {
		t.Fatal(err)
	}
	if got := time.Duration(env.lease.Load()); got != 10*time.Minute {
		t.Errorf("a call without a deadline reserved its key for %v, want the route's 10m", got)
	}
}

// TestGRPCTimeoutLessTheTimeSpent: the upstream gets what is left of the
// caller's grpc-timeout once idem has read the call and reserved its key
// (here a store whose Reserve moves the proxy's clock 300 ms), not the
// whole of it.
func TestGRPCTimeoutLessTheTimeSpent(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "")
	env.slow.Store(int64(300 * time.Millisecond))
	c := env.grpcClient(t)
	ctx, cancel := context.WithTimeout(keyed("left"), time.Minute)
	defer cancel()
	if _, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "left"}); err != nil {
		t.Fatal(err)
	}
	sent, _ := env.pay.timeout.Load().(string)
	got, err := time.ParseDuration(strings.NewReplacer("H", "h", "M", "m", "S", "s", "m", "ms", "u", "us", "n", "ns").Replace(sent))
	if err != nil {
		t.Fatalf("the upstream's grpc-timeout %q: %v", sent, err)
	}
	if got <= 0 || got > time.Minute-300*time.Millisecond {
		t.Errorf("the upstream got grpc-timeout %q (%v), want at most a minute less the 300 ms the store took", sent, got)
	}
}

// h2cClient speaks HTTP/2 with prior knowledge.
func h2cClient(t *testing.T) *http.Client {
	t.Helper()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// TestHTTPEdgesHoldOverH2C: the edges of HTTP/1.1 requests hold on
// HTTP/2 too: a lower-case method is refused, "//" is merged, hosts that
// differ only in spelling are one, a body over max_body gets 413.
func TestHTTPEdgesHoldOverH2C(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "max_body: 1024\n")
	hc := h2cClient(t)
	do := func(method, path, host, key string, body string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+env.addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		}
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Fatalf("answered in %s", resp.Proto)
		}
		return resp
	}
	if r := do("post", "/plain/pay", "", "m1", "{}"); r.StatusCode != http.StatusBadRequest || r.Header.Get("Idempotency-Outcome") != "invalid_method" {
		t.Errorf("lower-case post: %d %s", r.StatusCode, r.Header.Get("Idempotency-Outcome"))
	}
	a := do("POST", "//plain/pay", "", "m2", "{}")
	b := do("POST", "/plain/pay", "", "m2", "{}")
	if a.StatusCode != http.StatusCreated || b.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("//plain/pay then /plain/pay: %d, replayed %q", a.StatusCode, b.Header.Get("Idempotent-Replayed"))
	}
	c := do("POST", "/plain/host", "Shop.Example.:80", "m3", "{}")
	d := do("POST", "/plain/host", "shop.example", "m3", "{}")
	if c.StatusCode != http.StatusCreated || d.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("two spellings of a host: %d, replayed %q", c.StatusCode, d.Header.Get("Idempotent-Replayed"))
	}
	e := do("POST", "/plain/host", "other.example", "m3", "{}")
	if e.Header.Get("Idempotent-Replayed") != "" {
		t.Error("another host got shop.example's answer")
	}
	if r := do("POST", "/plain/big", "", "m4", strings.Repeat("x", 2048)); r.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over max_body: %d", r.StatusCode)
	}
	if n := env.pay.runsOf("plain post /plain/pay "); n != 0 {
		t.Errorf("a refused method ran %d times", n)
	}
	if n := env.pay.runsOf("plain POST /plain/big "); n != 0 {
		t.Errorf("a body over max_body ran %d times", n)
	}
}

// TestGRPCHugeAnswerMetadataNotStored: an answer whose metadata takes it
// past the bound on stored answers is passed on, and the key completed as
// not replayable, never stored past the bound.
func TestGRPCHugeAnswerMetadataNotStored(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "")
	c := env.grpcClient(t)
	ctx := metadata.AppendToOutgoingContext(keyed("fat"), "x-test-fat-trailer", "1")
	if _, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "fat"}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "fat"})
	if status.Code(err) != codes.AlreadyExists || reasonOf(err) != "NOT_REPLAYABLE" {
		t.Errorf("the retry: %v", err)
	}
	if n := env.pay.runsOf("fat"); n != 1 {
		t.Errorf("the upstream ran %d times", n)
	}
}

// TestGRPCTimeoutSpentBeforeForwarding: a call whose grpc-timeout was all
// spent by the proxy's clock before it could be forwarded (here the clock
// moves two minutes while the key is reserved, past the caller's one) is
// not sent with a token deadline, under which a slow upstream runs, or
// not, while the proxy gives up on it and leaves the key for review: it is
// answered DEADLINE_EXCEEDED, its key released unsent, and a retry runs
// it once.
func TestGRPCTimeoutSpentBeforeForwarding(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "")
	env.slow.Store(int64(2 * time.Minute))
	c := env.grpcClient(t)
	released := false
	t.Cleanup(func() {
		if !released {
			close(env.pay.release)
		}
	})
	ctx, cancel := context.WithTimeout(keyed("spent"), time.Minute)
	defer cancel()
	_, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "block"})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("a call whose deadline was spent before it was forwarded: %v, want DEADLINE_EXCEEDED", err)
	}
	if n := env.pay.runsOf("block"); n != 0 {
		t.Errorf("the upstream got the call %d times with its deadline spent", n)
	}
	env.slow.Store(0)
	close(env.pay.release)
	released = true
	got, err := c.Charge(keyed("spent"), &testpb.ChargeRequest{Account: "block"})
	if err != nil {
		t.Fatalf("the retry: %v (%s); want it run, the key released unsent", err, reasonOf(err))
	}
	if n := env.pay.runsOf("block"); got.GetRun() != 1 || n != 1 {
		t.Errorf("the retry ran as run %d, %d runs in all; want one", got.GetRun(), n)
	}
}

// TestGRPCTimeoutClockGoneBack: a proxy's clock that goes back while the
// key is reserved (here two minutes) gives the upstream no more than the
// caller's grpc-timeout.
func TestGRPCTimeoutClockGoneBack(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "")
	env.slow.Store(int64(-2 * time.Minute))
	c := env.grpcClient(t)
	ctx, cancel := context.WithTimeout(keyed("back"), time.Minute)
	defer cancel()
	if _, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "back"}); err != nil {
		t.Fatal(err)
	}
	sent, _ := env.pay.timeout.Load().(string)
	got, err := time.ParseDuration(strings.NewReplacer("H", "h", "M", "m", "S", "s", "m", "ms", "u", "us", "n", "ns").Replace(sent))
	if err != nil {
		t.Fatalf("the upstream's grpc-timeout %q: %v", sent, err)
	}
	if got <= 0 || got > time.Minute {
		t.Errorf("the upstream got grpc-timeout %q (%v), want at most the caller's minute", sent, got)
	}
}

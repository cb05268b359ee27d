package idemproxy_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// rawGRPC sends one gRPC call to idem serve over h2c with the frames of
// body as they are, and returns the answer's header, trailers and body.
func rawGRPC(t *testing.T, env *rpcEnv, hc *http.Client, header http.Header, body []byte) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+env.addr+"/idem.test.v1.Payments/Charge", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// grpcStatus is the grpc-status of an answer: its trailers', or its
// headers' (trailers-only).
func grpcStatus(resp *http.Response) string {
	if s := resp.Trailer.Get("Grpc-Status"); s != "" {
		return s
	}
	return resp.Header.Get("Grpc-Status")
}

// chargeFrame is a ChargeRequest for account in one gRPC frame.
func chargeFrame(t *testing.T, account string) []byte {
	t.Helper()
	m, err := proto.Marshal(&testpb.ChargeRequest{Account: account, Amount: 1})
	if err != nil {
		t.Fatal(err)
	}
	b := []byte{0, 0, 0, 0, byte(len(m))}
	return append(b, m...)
}

// TestGRPCHugeTimeoutIsNoDeadline: a grpc-timeout of eight digits of
// hours is valid (gRPC's PROTOCOL-HTTP2 allows up to 8 digits) and longer
// than any duration Go keeps: the call runs as one without a short
// deadline, never as one whose deadline wrapped around to the past or to
// a few minutes.
func TestGRPCHugeTimeoutIsNoDeadline(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "")
	hc := h2cClient(t)
	for _, tc := range []struct{ timeout, account string }{
		{"99999999H", "huge-h"}, // wraps to a negative duration
		{"5124096H", "wrap-h"},  // wraps to 25 minutes
		{"99999999M", "huge-m"}, // fits
		{"99999999S", "huge-s"}, // fits
	} {
		h := http.Header{"Idempotency-Key": {"t-" + tc.account}, "Grpc-Timeout": {tc.timeout}}
		resp, _ := rawGRPC(t, env, hc, h, chargeFrame(t, tc.account))
		if got := grpcStatus(resp); got != "0" {
			t.Errorf("grpc-timeout %s: grpc-status %q (%s, %s)", tc.timeout, got, resp.Header.Get("Idempotency-Outcome"), resp.Header.Get("Grpc-Message"))
		}
		if n := env.pay.runsOf(tc.account); n != 1 {
			t.Errorf("grpc-timeout %s: the upstream ran %d times", tc.timeout, n)
		}
	}
}

// TestGRPCHugeTimeoutKeepsTheWait: a duplicate whose grpc-timeout is
// centuries long waits the route's wait for the first call's answer, as
// one without a deadline does; a deadline too long to multiply does not
// turn the wait into none.
func TestGRPCHugeTimeoutKeepsTheWait(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "wait: 1m\n")
	hc := h2cClient(t)
	h := http.Header{"Idempotency-Key": {"hw"}}
	first := make(chan string, 1)
	go func() {
		resp, _ := rawGRPC(t, env, hc, h, chargeFrame(t, "block"))
		first <- grpcStatus(resp)
	}()
	<-env.pay.entered
	env.lease.Store(0)
	dup := make(chan *http.Response, 1)
	go func() {
		resp, _ := rawGRPC(t, env, hc, http.Header{"Idempotency-Key": {"hw"}, "Grpc-Timeout": {"99999999M"}}, chargeFrame(t, "block"))
		dup <- resp
	}()
	for env.lease.Load() == 0 { // the duplicate found the key in flight
		runtime.Gosched()
	}
	close(env.pay.release)
	resp := <-dup
	if grpcStatus(resp) != "0" || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the duplicate: grpc-status %q, outcome %s, replayed %q", grpcStatus(resp), resp.Header.Get("Idempotency-Outcome"), resp.Header.Get("Idempotent-Replayed"))
	}
	if s := <-first; s != "0" {
		t.Errorf("the first call: grpc-status %q", s)
	}
}

// TestGRPCRetryOverAnotherProtocol: a call made over gRPC and retried
// over gRPC-Web, then Connect, runs once and every retry reads the first
// answer; without descriptors a retry in JSON cannot be told equal to the
// first call's bytes, and is refused in words the client reads.
func TestGRPCRetryOverAnotherProtocol(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "")
	first, err := env.grpcClient(t).Charge(keyed("xp"), &testpb.ChargeRequest{Account: "xp", Amount: 4})
	if err != nil || first.GetRun() != 1 {
		t.Fatalf("gRPC: %v %v", first, err)
	}
	for name, opts := range map[string][]connect.ClientOption{"grpc-web": {connect.WithGRPCWeb()}, "connect": nil} {
		req := connect.NewRequest(&testpb.ChargeRequest{Account: "xp", Amount: 4})
		req.Header().Set("Idempotency-Key", "xp")
		res, err := env.connectClient(t, opts...).Charge(context.Background(), req)
		if err != nil || res.Msg.GetRun() != 1 || res.Header().Get("Idempotent-Replayed") != "true" || res.Trailer().Get("X-Ledger") != "entry-1" {
			t.Errorf("%s retry: %v %v", name, res, err)
		}
	}
	req := connect.NewRequest(&testpb.ChargeRequest{Account: "xp", Amount: 4})
	req.Header().Set("Idempotency-Key", "xp")
	_, err = env.connectClient(t, connect.WithProtoJSON()).Charge(context.Background(), req)
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeFailedPrecondition && ce.Code() != connect.CodeInvalidArgument {
		t.Errorf("a JSON retry without descriptors: %v", err)
	}
	if n := env.pay.runsOf("xp"); n != 1 {
		t.Errorf("the upstream ran %d times", n)
	}
}

// TestGRPCKeyOfTwoScopes: one key sent with two clients' credentials
// names two calls; neither gets the other's answer.
func TestGRPCKeyOfTwoScopes(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "")
	c := env.grpcClient(t)
	for i, cred := range []string{"Bearer alice", "Bearer mallory", "bearer alice"} {
		ctx := metadata.AppendToOutgoingContext(keyed("shared-key"), "authorization", cred)
		var hdr metadata.MD
		p, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "scoped"}, grpc.Header(&hdr))
		if err != nil || p.GetRun() != int64(i+1) || len(hdr.Get("idempotent-replayed")) != 0 {
			t.Errorf("%s: %v %v, replayed %v", cred, p, err, hdr.Get("idempotent-replayed"))
		}
	}
}

// TestGRPCMalformedFramesNeverForwarded: a request body whose length
// prefix lies (longer or shorter than its message), that carries two
// messages or none, or a compressed flag without grpc-encoding, is
// refused before its key is reserved, and never reaches the upstream.
func TestGRPCMalformedFramesNeverForwarded(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "")
	hc := h2cClient(t)
	good := chargeFrame(t, "frames")
	longer := bytes.Clone(good)
	longer[4] += 3
	shorter := bytes.Clone(good)
	shorter[4] -= 3
	compressed := bytes.Clone(good)
	compressed[0] = 1
	for name, body := range map[string][]byte{
		"longer":     longer,
		"shorter":    shorter,
		"two":        append(bytes.Clone(good), good...),
		"none":       nil,
		"compressed": compressed,
		"prefix":     good[:3],
	} {
		resp, _ := rawGRPC(t, env, hc, http.Header{"Idempotency-Key": {"f-" + name}}, body)
		if s := grpcStatus(resp); s == "" || s == "0" {
			t.Errorf("%s: grpc-status %q", name, s)
		}
		// The key was never reserved: the same key with a good body runs.
		resp, _ = rawGRPC(t, env, hc, http.Header{"Idempotency-Key": {"f-" + name}}, good)
		if s := grpcStatus(resp); s != "0" || resp.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("%s, then a good body: grpc-status %q (%s)", name, s, resp.Header.Get("Idempotency-Outcome"))
		}
	}
	if n := env.pay.runsOf("frames"); n != 6 {
		t.Errorf("the upstream ran %d times, want the 6 good bodies", n)
	}
}

// TestGRPCKeyMetadataSpellings: the key's metadata sent twice with one
// value is that key; with two values, or as idempotency-key-bin, it is
// refused or missing, never one of the two picked.
func TestGRPCKeyMetadataSpellings(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "")
	hc := h2cClient(t)
	body := chargeFrame(t, "spell")
	resp, _ := rawGRPC(t, env, hc, http.Header{"Idempotency-Key": {"sp", "sp"}}, body)
	if s := grpcStatus(resp); s != "0" && s != "3" {
		t.Errorf("one key twice: grpc-status %q", s)
	}
	resp, _ = rawGRPC(t, env, hc, http.Header{"Idempotency-Key": {"sp-a", "sp-b"}}, body)
	if s := grpcStatus(resp); s != "3" {
		t.Errorf("two keys: grpc-status %q (%s)", s, resp.Header.Get("Idempotency-Outcome"))
	}
	resp, _ = rawGRPC(t, env, hc, http.Header{"Idempotency-Key-Bin": {"c3AtYmlu"}}, body)
	if s := grpcStatus(resp); s != "3" || resp.Header.Get("Idempotency-Outcome") != "missing_key" {
		t.Errorf("a -bin key: grpc-status %q (%s)", s, resp.Header.Get("Idempotency-Outcome"))
	}
	if n := env.pay.runsOf("spell"); n > 1 {
		t.Errorf("the upstream ran %d times", n)
	}
}

// TestGRPCClientCancelAfterForwarding: a client that cancels its call
// once the upstream has it leaves its key reserved: the upstream's answer
// is stored, and the retry gets it without a second run.
func TestGRPCClientCancelAfterForwarding(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "")
	c := env.grpcClient(t)
	ctx, cancel := context.WithCancel(keyed("cx"))
	done := make(chan error, 1)
	go func() {
		_, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "block"})
		done <- err
	}()
	<-env.pay.entered
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Errorf("the cancelled call: %v", err)
	}
	close(env.pay.release)
	var hdr metadata.MD
	p, err := c.Charge(keyed("cx"), &testpb.ChargeRequest{Account: "block"}, grpc.Header(&hdr))
	if err != nil || p.GetRun() != 1 || len(hdr.Get("idempotent-replayed")) != 1 {
		t.Errorf("the retry: %v %v", p, err)
	}
	if n := env.pay.runsOf("block"); n != 1 {
		t.Errorf("the upstream ran %d times", n)
	}
}

// TestGRPCNewKeysPerScope: new_keys_per_scope counts the keys of gRPC
// calls as it counts HTTP requests': past the cap, a new key is refused
// with RESOURCE_EXHAUSTED (TOO_MANY_NEW_KEYS) and RetryInfo, unforwarded
// and released; a replay never counts, and another client has its own
// count.
func TestGRPCNewKeysPerScope(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "new_keys_per_scope: 2/1h\n")
	c := env.grpcClient(t)
	as := func(cred, key string) context.Context {
		return metadata.AppendToOutgoingContext(keyed(key), "authorization", cred)
	}
	for _, key := range []string{"n1", "n2", "n1"} {
		if _, err := c.Charge(as("Bearer alice", key), &testpb.ChargeRequest{Account: "capped"}); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
	}
	_, err := c.Charge(as("Bearer alice", "n3"), &testpb.ChargeRequest{Account: "capped"})
	if status.Code(err) != codes.ResourceExhausted || reasonOf(err) != "TOO_MANY_NEW_KEYS" || !hasRetryInfo(err) {
		t.Errorf("a third new key: %v", err)
	}
	if n := env.pay.runsOf("capped"); n != 2 {
		t.Errorf("the upstream ran %d times, want 2", n)
	}
	if _, err := c.Charge(as("Bearer bob", "n3"), &testpb.ChargeRequest{Account: "bob"}); err != nil {
		t.Errorf("another client's new key: %v", err)
	}
	if got := env.metric(t, "idem_proxy_new_keys_refused_total"); got != 1 {
		t.Errorf("idem_proxy_new_keys_refused_total %v, want 1", got)
	}
}

// TestGRPCNewKeyRefundedWhenUnsent: a key released because nothing
// reached the upstream gives its count back: a client of an upstream
// that is down is not refused for keys that never ran.
func TestGRPCNewKeyRefundedWhenUnsent(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close()
	env := (&rpcEnv{pay: newPayments()}).start(t, "upstream: h2c://"+down+"\nnew_keys_per_scope: 1/1h\n")
	c := env.grpcClient(t)
	for _, key := range []string{"u1", "u2", "u3"} {
		_, err := c.Charge(keyed(key), &testpb.ChargeRequest{Account: "down"})
		if reasonOf(err) != "UPSTREAM_UNREACHABLE" {
			t.Errorf("%s: %v", key, err)
		}
	}
}

// wireCharge builds a ChargeRequest's bytes field by field, in the order
// given, so that two encodings of one message can differ on the wire.
func wireCharge(fields ...func([]byte) []byte) []byte {
	var b []byte
	for _, f := range fields {
		b = f(b)
	}
	return append([]byte{0, 0, 0, 0, byte(len(b))}, b...)
}

func wireAccount(s string) func([]byte) []byte {
	return func(b []byte) []byte {
		return protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), s)
	}
}

func wireAmount(n uint64) func([]byte) []byte {
	return func(b []byte) []byte {
		return protowire.AppendVarint(protowire.AppendTag(b, 2, protowire.VarintType), n)
	}
}

func wireRequestID(s string) func([]byte) []byte {
	return func(b []byte) []byte {
		return protowire.AppendString(protowire.AppendTag(b, 4, protowire.BytesType), s)
	}
}

func wireUnknown(b []byte) []byte {
	return protowire.AppendVarint(protowire.AppendTag(b, 99, protowire.VarintType), 7)
}

// TestGRPCFingerprintWithDescriptors: with descriptors, a retry whose
// fields come in another order, with an explicit default value, or with a
// field the method does not know, is the same call (the canonical
// fingerprint, idemgrpc's); another amount is not. Without them, the
// fingerprint is the bytes: reordered fields are another call.
func TestGRPCFingerprintWithDescriptors(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "proto_descriptor_set: "+descriptorSet(t)+"\n")
	hc := h2cClient(t)
	h := http.Header{"Idempotency-Key": {"fp"}}
	first, _ := rawGRPC(t, env, hc, h, wireCharge(wireAccount("fp"), wireAmount(5)))
	if grpcStatus(first) != "0" {
		t.Fatalf("first: %q %s", grpcStatus(first), first.Header.Get("Grpc-Message"))
	}
	for name, body := range map[string][]byte{
		"reordered":     wireCharge(wireAmount(5), wireAccount("fp")),
		"repeated":      wireCharge(wireAmount(9), wireAccount("fp"), wireAmount(5)), // the last one wins
		"unknown field": wireCharge(wireAccount("fp"), wireUnknown, wireAmount(5)),
		"default":       wireCharge(wireAccount("fp"), wireAmount(5), wireRequestID("")),
	} {
		resp, _ := rawGRPC(t, env, hc, h, body)
		if grpcStatus(resp) != "0" || resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("%s: grpc-status %q, outcome %s", name, grpcStatus(resp), resp.Header.Get("Idempotency-Outcome"))
		}
	}
	resp, _ := rawGRPC(t, env, hc, h, wireCharge(wireAccount("fp"), wireAmount(6)))
	if resp.Header.Get("Idempotency-Outcome") != "mismatch" {
		t.Errorf("another amount: grpc-status %q, outcome %s", grpcStatus(resp), resp.Header.Get("Idempotency-Outcome"))
	}
	if n := env.pay.runsOf("fp"); n != 1 {
		t.Errorf("the upstream ran %d times", n)
	}

	bytesEnv := startRPC(t, "")
	rawGRPC(t, bytesEnv, hc, h, wireCharge(wireAccount("fp"), wireAmount(5)))
	resp, _ = rawGRPC(t, bytesEnv, hc, h, wireCharge(wireAmount(5), wireAccount("fp")))
	if resp.Header.Get("Idempotency-Outcome") != "mismatch" {
		t.Errorf("reordered bytes without descriptors: outcome %s", resp.Header.Get("Idempotency-Outcome"))
	}
}

// TestGRPCKeyInMetadataAndField: with descriptors, a call whose
// idempotency-key metadata and request_id field name two keys is refused
// unforwarded; naming one key twice is that key.
func TestGRPCKeyInMetadataAndField(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "proto_descriptor_set: "+descriptorSet(t)+"\n")
	hc := h2cClient(t)
	const id = "0b0f6f7e-5a3c-4c55-9d43-7a1f3c0e9a11"
	resp, _ := rawGRPC(t, env, hc, http.Header{"Idempotency-Key": {"other-key"}}, wireCharge(wireAccount("both"), wireRequestID(id)))
	if s := grpcStatus(resp); s != "3" {
		t.Errorf("two keys: grpc-status %q (%s): %s", s, resp.Header.Get("Idempotency-Outcome"), resp.Header.Get("Grpc-Message"))
	}
	if n := env.pay.runsOf("both"); n != 0 {
		t.Errorf("the upstream ran %d times", n)
	}
	resp, _ = rawGRPC(t, env, hc, http.Header{"Idempotency-Key": {id}}, wireCharge(wireAccount("both"), wireRequestID(id)))
	if s := grpcStatus(resp); s != "0" {
		t.Errorf("one key twice: grpc-status %q (%s): %s", s, resp.Header.Get("Idempotency-Outcome"), resp.Header.Get("Grpc-Message"))
	}
}

// rawUpstream is an h2c upstream written with http2.Framer: it reads each
// call's HEADERS and DATA, answers HEADERS and one message, and then does
// what end says (a reset, a GOAWAY and a closed connection), never the
// trailers. It counts the calls it had.
func rawUpstream(t *testing.T, end func(fr *http2.Framer, conn net.Conn, stream uint32)) (addr string, calls *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	calls = new(atomic.Int32)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				preface := make([]byte, len(http2.ClientPreface))
				if _, err := io.ReadFull(conn, preface); err != nil {
					return
				}
				fr := http2.NewFramer(conn, conn)
				if fr.WriteSettings() != nil {
					return
				}
				for {
					f, err := fr.ReadFrame()
					if err != nil {
						return
					}
					switch f := f.(type) {
					case *http2.SettingsFrame:
						if !f.IsAck() {
							_ = fr.WriteSettingsAck()
						}
					case *http2.PingFrame:
						if !f.IsAck() {
							_ = fr.WritePing(true, f.Data)
						}
					case *http2.DataFrame:
						if !f.StreamEnded() {
							continue
						}
						calls.Add(1)
						var hb bytes.Buffer
						enc := hpack.NewEncoder(&hb)
						_ = enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
						_ = enc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
						_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: hb.Bytes(), EndHeaders: true})
						msg, _ := proto.Marshal(&testpb.Payment{Id: "raw", Run: 1})
						_ = fr.WriteData(f.StreamID, false, append([]byte{0, 0, 0, 0, byte(len(msg))}, msg...))
						end(fr, conn, f.StreamID)
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), calls
}

// TestGRPCUpstreamBreaksBeforeTrailers: an upstream that sent its
// headers and its message, then reset the stream, or sent GOAWAY and
// closed its connection, before any trailers: the call ran with an
// unknown outcome, so its key goes to review, is never stored as a
// success nor released, and the retry is not forwarded.
func TestGRPCUpstreamBreaksBeforeTrailers(t *testing.T) {
	t.Parallel()
	for name, end := range map[string]func(*http2.Framer, net.Conn, uint32){
		"reset":  func(fr *http2.Framer, _ net.Conn, id uint32) { _ = fr.WriteRSTStream(id, http2.ErrCodeInternal) },
		"cancel": func(fr *http2.Framer, _ net.Conn, id uint32) { _ = fr.WriteRSTStream(id, http2.ErrCodeCancel) },
		"no error": func(fr *http2.Framer, _ net.Conn, id uint32) {
			_ = fr.WriteRSTStream(id, http2.ErrCodeNo)
		},
		"goaway": func(fr *http2.Framer, conn net.Conn, id uint32) {
			_ = fr.WriteGoAway(id, http2.ErrCodeNo, nil)
			conn.Close()
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			up, calls := rawUpstream(t, end)
			env := (&rpcEnv{pay: newPayments()}).start(t, "upstream: h2c://"+up+"\n")
			c := env.grpcClient(t)
			_, err := c.Charge(keyed("brk"), &testpb.ChargeRequest{Account: "brk"})
			if reasonOf(err) != "UPSTREAM_FAILED" {
				t.Errorf("the call: %v", err)
			}
			_, err = c.Charge(keyed("brk"), &testpb.ChargeRequest{Account: "brk"})
			if reasonOf(err) != "NEEDS_REVIEW" {
				t.Errorf("the retry: %v", err)
			}
			if n := calls.Load(); n != 1 {
				t.Errorf("the upstream had %d calls", n)
			}
		})
	}
}

// TestGRPCWrongTransportForThePort: an h2c client at the TLS listener,
// and a TLS client at the cleartext one, fail at the connection; no call
// reaches the upstream, and the listener serves its own clients after.
func TestGRPCWrongTransportForThePort(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	yaml, _, _ := tlsFiles(t, ca, "wrong")
	tlsEnv := startRPC(t, yaml)
	plainEnv := startRPC(t, "")
	if _, err := tlsEnv.grpcClient(t).Charge(keyed("w1"), &testpb.ChargeRequest{Account: "wrong"}); status.Code(err) != codes.Unavailable {
		t.Errorf("h2c at the TLS port: %v", err)
	}
	tc, err := grpc.NewClient(plainEnv.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.pool()})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tc.Close() })
	if _, err := testpb.NewPaymentsClient(tc).Charge(keyed("w2"), &testpb.ChargeRequest{Account: "wrong"}); status.Code(err) != codes.Unavailable {
		t.Errorf("TLS at the cleartext port: %v", err)
	}
	if n := tlsEnv.pay.runsOf("wrong") + plainEnv.pay.runsOf("wrong"); n != 0 {
		t.Errorf("the upstreams ran %d times", n)
	}
	if _, err := plainEnv.grpcClient(t).Charge(keyed("w2"), &testpb.ChargeRequest{Account: "wrong"}); err != nil {
		t.Errorf("h2c at the cleartext port, after: %v", err)
	}
}

// TestConnectGatewayErrorIsNotStored: a Connect call answered by a
// gateway's HTTP error instead of a Connect one is settled by its HTTP
// status, as a gRPC call's is: a 502 leaves the call's effect unknown
// (review, never stored as the answer), a 503 releases the key.
func TestConnectGatewayErrorIsNotStored(t *testing.T) {
	t.Parallel()
	var calls, calls503 atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		w.Header().Set("Content-Type", "text/html")
		if r.Header.Get("X-Test-Status") == "503" && calls503.Add(1) > 1 {
			w.Header().Set("Content-Type", "application/proto")
			msg, _ := proto.Marshal(&testpb.Payment{Id: "after-503", Run: int64(n)})
			w.Write(msg)
			return
		}
		st, _ := strconv.Atoi(r.Header.Get("X-Test-Status"))
		w.WriteHeader(st)
		io.WriteString(w, "<html>bad gateway</html>")
	}))
	t.Cleanup(up.Close)
	env := (&rpcEnv{pay: newPayments()}).start(t, "upstream: "+up.URL+"\n")
	c := env.connectClient(t)
	call := func(key, st string) (*connect.Response[testpb.Payment], error) {
		req := connect.NewRequest(&testpb.ChargeRequest{Account: "gw"})
		req.Header().Set("Idempotency-Key", key)
		req.Header().Set("X-Test-Status", st)
		return c.Charge(context.Background(), req)
	}
	var ce *connect.Error
	if _, err := call("gw-502", "502"); !errors.As(err, &ce) || ce.Code() != connect.CodeUnavailable {
		t.Errorf("a 502: %v", err)
	}
	res, err := call("gw-502", "502")
	if !errors.As(err, &ce) || ce.Code() != connect.CodeFailedPrecondition || ce.Meta().Get("Idempotency-Outcome") != "needs_review" {
		t.Errorf("the retry of a 502: %v %v", res, err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the upstream had %d calls of the 502", n)
	}
	if _, err := call("gw-503", "503"); !errors.As(err, &ce) || ce.Code() != connect.CodeUnavailable {
		t.Errorf("a 503: %v", err)
	}
	if res, err := call("gw-503", "503"); err != nil || res.Msg.GetId() != "after-503" {
		t.Errorf("the retry of a 503: %v %v", res, err)
	}
}

// TestGRPCWebAnswerNotCompressedByHTTP: a gRPC-Web client (a browser)
// sends Accept-Encoding: gzip; idem asks the upstream for an answer it
// can store, so an upstream that compresses HTTP bodies it may compress
// does not send the call to review with an answer idem cannot read.
func TestGRPCWebAnswerNotCompressedByHTTP(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		msg, _ := proto.Marshal(&testpb.Payment{Id: "web-gz", Run: 1})
		body := append([]byte{0, 0, 0, 0, byte(len(msg))}, msg...)
		tr := "grpc-status: 0\r\n"
		body = append(append(body, 0x80, 0, 0, 0, byte(len(tr))), tr...)
		w.Header().Set("Content-Type", "application/grpc-web+proto")
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			zw.Write(body)
			zw.Close()
			return
		}
		w.Write(body)
	}))
	t.Cleanup(up.Close)
	env := (&rpcEnv{pay: newPayments()}).start(t, "upstream: "+up.URL+"\n")
	for i := range 2 {
		req, err := http.NewRequest(http.MethodPost, "http://"+env.addr+"/idem.test.v1.Payments/Charge", bytes.NewReader(chargeFrame(t, "web-gz")))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/grpc-web+proto")
		req.Header.Set("Accept-Encoding", "gzip")
		req.Header.Set("Idempotency-Key", "web-gz")
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.Header.Get("Content-Encoding") == "gzip" {
			t.Fatalf("call %d: a gzipped answer", i)
		}
		if !bytes.Contains(b, []byte("grpc-status: 0")) || !bytes.Contains(b, []byte("web-gz")) {
			t.Errorf("call %d: outcome %s, body %q", i, resp.Header.Get("Idempotency-Outcome"), b)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the upstream had %d calls", n)
	}
}

// TestGRPCClientResetMidUpload: a client that sends its call's headers
// and part of its message and then resets the stream (RST_STREAM
// CANCEL): nothing reaches the upstream, and the key holds nothing, so
// the whole call sent again with it runs once.
func TestGRPCClientResetMidUpload(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "")
	conn, err := net.Dial("tcp", env.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", env.addr}, {":path", "/idem.test.v1.Payments/Charge"},
		{"content-type", "application/grpc"}, {"te", "trailers"}, {"idempotency-key", "mid-upload"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	body := chargeFrame(t, "mid-upload")
	if err := fr.WriteData(1, false, body[:len(body)/2]); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteRSTStream(1, http2.ErrCodeCancel); err != nil {
		t.Fatal(err)
	}
	// A ping answered after the reset: the proxy has read the reset.
	if err := fr.WritePing(false, [8]byte{1}); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
			break
		}
	}
	resp, _ := rawGRPC(t, env, h2cClient(t), http.Header{"Idempotency-Key": {"mid-upload"}}, body)
	if s := grpcStatus(resp); s != "0" || resp.Header.Get("Idempotent-Replayed") != "" {
		t.Errorf("the whole call, after: grpc-status %q, outcome %s", s, resp.Header.Get("Idempotency-Outcome"))
	}
	if n := env.pay.runsOf("mid-upload"); n != 1 {
		t.Errorf("the upstream ran %d times", n)
	}
}

// TestGRPCLargeAnswerWithoutStatusGoesToReview: an answer too large to
// keep that ends without grpc-status (no trailers) left the call's
// outcome unknown, as a small one does: its key goes to review, not
// completed, and the client's stream is reset rather than ended as if
// whole.
func TestGRPCLargeAnswerWithoutStatusGoesToReview(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	up := &http.Server{Protocols: &protos, ErrorLog: quietLog(), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.Copy(io.Discard, r.Body)
		msg, _ := proto.Marshal(&testpb.Payment{Id: strings.Repeat("x", 2<<20)})
		w.Header().Set("Content-Type", "application/grpc")
		w.WriteHeader(http.StatusOK)
		w.Write(appendPrefix(msg))
		if r.Header.Get("X-Test-Status") != "" {
			w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
		}
	})}
	go up.Serve(ln)
	t.Cleanup(func() { up.Close() })
	env := (&rpcEnv{pay: newPayments()}).start(t, "upstream: h2c://"+ln.Addr().String()+"\n")
	c := env.grpcClient(t, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20)))
	if _, err := c.Charge(keyed("big-nostatus"), &testpb.ChargeRequest{Account: "x"}); err == nil {
		t.Error("an answer without grpc-status reached the client as a success")
	}
	_, err = c.Charge(keyed("big-nostatus"), &testpb.ChargeRequest{Account: "x"})
	if reasonOf(err) != "NEEDS_REVIEW" {
		t.Errorf("the retry: %v", err)
	}
	// With its status, the large answer passes and its key is completed
	// as not replayable.
	ctx := metadata.AppendToOutgoingContext(keyed("big-status"), "x-test-status", "1")
	if _, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "x"}); err != nil {
		t.Errorf("a large answer with its status: %v", err)
	}
	if _, err := c.Charge(ctx, &testpb.ChargeRequest{Account: "x"}); reasonOf(err) != "NOT_REPLAYABLE" {
		t.Errorf("its retry: %v", err)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("the upstream had %d calls", n)
	}
}

func appendPrefix(msg []byte) []byte {
	b := []byte{0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// TestRPCReleaseStatusesAreTheRoutes: a call answered by a gateway with
// one of the route's own release_statuses releases its key, as an HTTP
// request's does, so the retry reaches the upstream; the defaults (429,
// 503) are only the defaults.
func TestRPCReleaseStatusesAreTheRoutes(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusTeapot)
			io.WriteString(w, "<html>busy</html>")
			return
		}
		w.Header().Set("Content-Type", "application/proto")
		msg, _ := proto.Marshal(&testpb.Payment{Id: "after-418"})
		w.Write(msg)
	}))
	t.Cleanup(up.Close)
	env := (&rpcEnv{pay: newPayments()}).start(t, "upstream: "+up.URL+"\nrelease_statuses: [418]\n")
	c := env.connectClient(t)
	call := func() (*connect.Response[testpb.Payment], error) {
		req := connect.NewRequest(&testpb.ChargeRequest{Account: "gw"})
		req.Header().Set("Idempotency-Key", "gw-418")
		return c.Charge(context.Background(), req)
	}
	if _, err := call(); err == nil {
		t.Fatal("the gateway's 418 was answered as a success")
	}
	if res, err := call(); err != nil || res.Msg.GetId() != "after-418" {
		t.Errorf("the retry after a released 418: %v %v; want the upstream's answer", res, err)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("the upstream had %d calls, want 2", n)
	}
}

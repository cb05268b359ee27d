package idemproxy_test

import (
	"bytes"
	"io"
	"net/http"
	"runtime"
	"testing"

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

package idemproxy

import (
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idem-dev/idem"
)

// TestRPCReplayAlwaysCarriesAStatus: every replay ends with a
// grpc-status, also of an answer an operator or a resolver stored through
// the admin API (an HTTP answer, without one).
func TestRPCReplayAlwaysCarriesAStatus(t *testing.T) {
	t.Parallel()
	grpcCall := rpcCall{kind: rpcGRPC, contentType: "application/grpc"}
	for _, tc := range []struct {
		name   string
		stored *idem.Response
		code   int
		inBody bool
	}{
		{"operator's 2xx message", &idem.Response{Status: 201, Header: http.Header{}, Body: []byte{0x0a, 0x01, 'x'}}, 0, true},
		{"operator's 409", &idem.Response{Status: 409, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("settled by hand")}, 10, false},
		{"operator's 500", &idem.Response{Status: 500, Header: http.Header{}}, 13, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := decodeRPCAnswer(tc.stored)
			if err != nil {
				t.Fatal(err)
			}
			rec := httptest.NewRecorder()
			writeRPC(rec, grpcCall, a, true)
			res := rec.Result()
			got := res.Header.Get("Grpc-Status")
			if got == "" {
				got = res.Trailer.Get("Grpc-Status")
			}
			if got != strconv.Itoa(tc.code) {
				t.Errorf("grpc-status %q, want %d (header %v, trailer %v)", got, tc.code, res.Header, res.Trailer)
			}
			if (rec.Body.Len() > 0) != tc.inBody {
				t.Errorf("body %q", rec.Body.Bytes())
			}
		})
	}
}

// TestRPCStoredFormRoundTrip: what is stored of an answer is replayed as
// it was: metadata, message, status, details and trailers, in each
// protocol.
func TestRPCStoredFormRoundTrip(t *testing.T) {
	t.Parallel()
	detail, _ := anypb.New(&spb.Status{Message: "inner"})
	for _, a := range []*rpcAnswer{
		{header: http.Header{"X-A": {"1"}}, trailer: http.Header{"X-T": {"2"}, "X-Trace-Bin": {"AAE"}}, msg: []byte{1, 2, 3}, hasMsg: true, st: &spb.Status{}},
		{header: http.Header{}, trailer: http.Header{"X-T": {"2"}}, st: &spb.Status{Code: 9, Message: "déclin", Details: []*anypb.Any{detail}}},
		{header: http.Header{}, trailer: http.Header{}, st: &spb.Status{}},
	} {
		resp, err := encodeRPCAnswer(a)
		if err != nil {
			t.Fatal(err)
		}
		b, err := decodeRPCAnswer(resp)
		if err != nil {
			t.Fatal(err)
		}
		if b.hasMsg != a.hasMsg || string(b.msg) != string(a.msg) || b.st.GetCode() != a.st.GetCode() || b.st.GetMessage() != a.st.GetMessage() ||
			len(b.st.GetDetails()) != len(a.st.GetDetails()) || b.header.Get("X-A") != a.header.Get("X-A") ||
			b.trailer.Get("X-T") != a.trailer.Get("X-T") || b.trailer.Get("X-Trace-Bin") != a.trailer.Get("X-Trace-Bin") {
			t.Errorf("stored %+v, read back %+v", a, b)
		}
		// Written as gRPC and read back by the proxy's own parser: the
		// same answer.
		rec := httptest.NewRecorder()
		c := rpcCall{kind: rpcGRPC, contentType: "application/grpc"}
		writeRPC(rec, c, b, true)
		res := rec.Result()
		trailer := res.Trailer
		if len(trailer) == 0 {
			trailer = http.Header{}
		}
		back, err := parseRPCAnswer(c, res.StatusCode, res.Header, rec.Body.Bytes(), trailer, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if back.st.GetCode() != a.st.GetCode() || back.st.GetMessage() != a.st.GetMessage() || len(back.st.GetDetails()) != len(a.st.GetDetails()) ||
			string(back.msg) != string(a.msg) || back.trailer.Get("X-T") != a.trailer.Get("X-T") {
			t.Errorf("written and parsed: %+v, want %+v", back, a)
		}
	}
}

// TestRPCBodyBudgetChargedByBytes: a call's body holds the body budget
// for the room its buffer grew to as the bytes arrived (its announced
// length and a byte to see the end, or 512 bytes then doubling when no
// length is announced), not for a fixed read buffer, and gives it back.
func TestRPCBodyBudgetChargedByBytes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		body      io.Reader
		length    int64
		wantBytes string
		wantHeld  int64
	}{
		{"announced", strings.NewReader("0123456789"), 10, "0123456789", 11},
		{"unannounced", io.MultiReader(strings.NewReader("0123456789")), -1, "0123456789", 512},
		{"unannounced, past the first room", io.MultiReader(strings.NewReader(strings.Repeat("x", 600))), -1, strings.Repeat("x", 600), 512 + 512},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Proxy{bodies: idem.NewBodyBudget(1 << 20)}
			rr := &rpcRoute{p: p, maxBody: 1 << 20}
			r := httptest.NewRequest(http.MethodPost, "/pkg.S/M", tc.body)
			r.ContentLength = tc.length
			body, held, st, _ := rr.readBody(r, rpcCall{kind: rpcGRPC})
			if st != nil || string(body) != tc.wantBytes || held != tc.wantHeld || p.bodies.Used() != held {
				t.Errorf("body of %d bytes, held %d (want %d), budget used %d, status %v", len(body), held, tc.wantHeld, p.bodies.Used(), st)
			}
			p.bodies.Release(held)
			if p.bodies.Used() != 0 {
				t.Errorf("budget used %d after", p.bodies.Used())
			}
		})
	}
}

// TestRPCBodyRefusals: a body past max_body is refused as too large, and
// one the budget has no room for as busy, each giving back what it held.
func TestRPCBodyRefusals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		budget  int64
		maxBody int64
		body    string
		want    string
	}{
		{"over max_body", 1 << 20, 100, strings.Repeat("x", 101), idem.SituationBodyTooLarge.Name},
		{"at max_body", 1 << 20, 100, strings.Repeat("x", 100), ""},
		{"no room", 256, 1 << 20, strings.Repeat("x", 1000), idem.SituationBusy.Name},
		{"max_body of math.MaxInt64", 1 << 20, math.MaxInt64, strings.Repeat("x", 1000), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Proxy{bodies: idem.NewBodyBudget(tc.budget)}
			rr := &rpcRoute{p: p, maxBody: tc.maxBody}
			r := httptest.NewRequest(http.MethodPost, "/pkg.S/M", io.MultiReader(strings.NewReader(tc.body)))
			r.ContentLength = -1
			_, held, st, outcome := rr.readBody(r, rpcCall{kind: rpcGRPC})
			if outcome != tc.want || (st == nil) != (tc.want == "") {
				t.Errorf("outcome %q, status %v; want %q", outcome, st, tc.want)
			}
			p.bodies.Release(held)
			if p.bodies.Used() != 0 {
				t.Errorf("budget used %d after", p.bodies.Used())
			}
		})
	}
}

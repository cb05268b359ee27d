package idem_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
)

// v1Corpus is a set of inputs whose v1 fingerprints were recorded from the
// v1 implementation; the legacy computation must still give exactly those.
var v1Corpus = []struct {
	in   idem.FingerprintInput
	opts idem.FingerprintOptions
}{
	{idem.FingerprintInput{Method: "POST", Operation: "POST /payments", ContentType: "application/json", Body: []byte(`{"currency":"usd","amount":1000,"customer":"cus_123","metadata":{"order":"A-17","note":"gift"}}`)}, idem.FingerprintOptions{}},
	{idem.FingerprintInput{Method: "post", Operation: "POST /payments", Path: "/payments", Query: "b=2&a=1&a=0", ContentType: "application/json; charset=utf-8", Body: []byte(` {"amount":1.50e2, "z":[1,2.0,-0,0.001,12345678901234567890123,1e400], "s":"\u00e9\/\n\u0001\ud83d\ude00"} `)}, idem.FingerprintOptions{}},
	{idem.FingerprintInput{Method: "POST", Operation: "POST /p", ContentType: "application/vnd.api+json", Body: []byte(`{"amount":1,"amount":1000,"Amount":5}`)}, idem.FingerprintOptions{}},
	{idem.FingerprintInput{Method: "POST", Operation: "POST /p", ContentType: "application/json", Body: []byte(`{"order":{"amount":1,"trace":"a"},"items":[{"sku":"x","n":1},{"sku":"y"}],"note":"a","x":5}`)}, idem.FingerprintOptions{IncludeFields: []string{"/order", "/items/0/sku", "/x/y"}, ExcludeFields: []string{"/order/trace"}}},
	{idem.FingerprintInput{Method: "POST", Operation: "POST /p", ContentType: "application/json", Body: []byte(`{"amount":1,"meta":{"trace":"x","keep":2},"items":[{"ts":1},{"ts":2}],"a/b":3,"m~n":4}`)}, idem.FingerprintOptions{ExcludeFields: []string{"/meta/trace", "/items/1/ts", "/a~1b", "/m~0n"}}},
	{idem.FingerprintInput{Method: "POST", Operation: "POST /p", ContentType: "application/json", Body: []byte(`{"amount":`)}, idem.FingerprintOptions{}},
	{idem.FingerprintInput{Method: "POST", Operation: "POST /p", ContentType: "text/plain", Body: []byte(`amount=5`)}, idem.FingerprintOptions{}},
	{idem.FingerprintInput{Method: "POST", Operation: "POST /p", Query: "x=%zz", ContentType: "application/x-www-form-urlencoded", Body: []byte(`amount=5&b=a+b`)}, idem.FingerprintOptions{}},
	{idem.FingerprintInput{Method: "POST", Operation: "POST /p", ContentType: "multipart/form-data; boundary=AAA", Body: []byte("--AAA\r\nContent-Disposition: form-data; name=\"amount\"\r\n\r\n100\r\n--AAA--\r\n")}, idem.FingerprintOptions{}},
	{idem.FingerprintInput{Method: "PUT", Operation: "PUT /x", Body: nil}, idem.FingerprintOptions{}},
	{idem.FingerprintInput{Method: "POST", Operation: "POST /payments", ContentType: "application/json", Body: []byte(`{"amount":100}`)}, idem.FingerprintOptions{Key: []byte("secret-a")}},
	{idem.FingerprintInput{Method: "POST", Operation: "POST /payments", ContentType: "application/json", Body: []byte(`[{"b":1,"a":{"d":[],"c":{}}},true,false,null,"x"]`)}, idem.FingerprintOptions{Key: []byte("secret-b")}},
}

// v1Golden are the fingerprints that the v1 implementation gave v1Corpus.
var v1Golden = []string{
	"v1:df31b36645a1c10012a90636952d0f9aabb72605b10e11bf9e42996c76ba2f08",
	"v1:2e8c478be8bebb1a00f55bd941938395a61f16522c4feba9db251139e9a4ee68",
	"v1:acde21d2419bfd6b0bfcd98158d09ede229d9f17a9b2944c01d32ed9394166f1",
	"v1:36c165bd66d9c5cf89be9712cc7e364b8257402768746f224771abc96aefe9f9",
	"v1:ba7c2658298ead553703667531eb235f0be851fc87b57664e65b705a60db1497",
	"v1:0716276d683ddcc26b8ff213e4d3ba9718dfa172c3c123088de33e1132d67f20",
	"v1:daecb06ec3a09991cb4fc1b344ca6f57d00107842ff74534b59fd75a8b1955c8",
	"v1:15c460f987ce33769254437b25d8af6200dac38108bb88cd600cad1ae052b04e",
	"v1:86456678ea05a3f2053a45c59eb28c16732e9021fbd64a2d2b4da97a425a769d",
	"v1:c92b3353a4652e19bfec898e52afb3ca55b80ee65753df1cf64bac7e8969e5c4",
	"v1k:34215d5d252bdcb53377cb4d159d230f83d52c9bc04600727cb55af168744fbb",
	"v1k:ba87a5dc48bc25b14c4afa8deddc5e777e396fa7fbedbe8bac87823a01e085fe",
}

// TestFingerprintV1Unchanged: records stored before version v2 are
// compared by the v1 computation, which must give what v1 gave.
func TestFingerprintV1Unchanged(t *testing.T) {
	t.Parallel()
	for i, c := range v1Corpus {
		got, err := idem.FingerprintV1(c.in, c.opts)
		if err != nil || got != v1Golden[i] {
			t.Errorf("v1 fingerprint of case %d: %s, %v; v1 gave %s", i, got, err, v1Golden[i])
		}
	}
}

// TestFingerprintMatchesEarlier: a record fingerprinted by v1 matches a
// retry that v1 fingerprints the same, except where v1 is known to confuse
// requests that mean different things.
func TestFingerprintMatchesEarlier(t *testing.T) {
	t.Parallel()
	json := func(body string) idem.FingerprintInput {
		return idem.FingerprintInput{Method: "POST", Operation: "POST /p", Path: "/p", ContentType: "application/json", Body: []byte(body)}
	}
	with := func(in idem.FingerprintInput, ct, body string) idem.FingerprintInput {
		in.ContentType, in.Body = ct, []byte(body)
		return in
	}
	_, curl := multipartForm(t, "------------------------d74496d66958873e", [3]string{"amount", "", "100"})
	curlCT := "multipart/form-data; boundary=------------------------d74496d66958873e"
	_, forB := multipartForm(t, "BBB", [3]string{"amount", "", "999"})
	_, forA := multipartForm(t, "AAA", [3]string{"amount", "", "100"})
	key := []byte("fingerprint-key")
	cases := []struct {
		why    string
		first  idem.FingerprintInput // fingerprinted by v1
		retry  idem.FingerprintInput // by this version
		key    []byte                // the first's key; the retry's is key
		want   bool
		source bool // false: no FingerprintSource
	}{
		{"the same JSON", json(`{"amount":100}`), json(`{"amount":100}`), nil, true, true},
		{"the same JSON, members reordered", json(`{"b":1,"amount":100}`), json(` {"amount":100, "b":1}`), nil, true, true},
		{"the same form", with(json(""), "application/x-www-form-urlencoded", "a=1"), with(json(""), "application/x-www-form-urlencoded", "a=1"), nil, true, true},
		{"the same multipart body", with(json(""), curlCT, curl), with(json(""), curlCT, curl), nil, true, true},
		{"the same keyed JSON", json(`{"amount":100}`), json(`{"amount":100}`), key, true, true},
		{"another body", json(`{"amount":100}`), json(`{"amount":101}`), nil, false, true},
		{"another key", json(`{"amount":100}`), json(`{"amount":100}`), []byte("other-key"), false, true},
		{"no source", json(`{"amount":100}`), json(`{"amount":100}`), nil, false, false},
		// v1 sorted duplicate names by value: it cannot tell these apart.
		{"duplicates reordered", json(`{"amount":1,"amount":1000}`), json(`{"amount":1000,"amount":1}`), nil, false, true},
		{"duplicates, even as sent", json(`{"amount":1,"amount":1000}`), json(`{"amount":1,"amount":1000}`), nil, false, true},
		{"case twins reordered", json(`{"amount":1,"Amount":1000}`), json(`{"Amount":1000,"amount":1}`), nil, false, true},
		{"nested duplicates", json(`{"o":[{"a":1,"a":2}]}`), json(`{"o":[{"a":2,"a":1}]}`), nil, false, true},
		// v1 did not count the Content-Type: these bytes read differently
		// under their two boundaries.
		{"one body, two boundaries", with(json(""), "multipart/form-data; boundary=AAA", forB+forA), with(json(""), "multipart/form-data; boundary=BBB", forB+forA), nil, false, true},
		{"one body, two boundaries, as sent", with(json(""), "multipart/form-data; boundary=BBB", forB+forA), with(json(""), "multipart/form-data; boundary=BBB", forB+forA), nil, false, true},
		{"multipart without a boundary", with(json(""), "multipart/form-data", curl), with(json(""), "multipart/form-data", curl), nil, false, true},
	}
	for _, tc := range cases {
		stored, err := idem.FingerprintV1(tc.first, idem.FingerprintOptions{Key: tc.key})
		if err != nil {
			t.Fatal(err)
		}
		var src *idem.FingerprintSource
		if tc.source {
			src = &idem.FingerprintSource{Input: tc.retry, Options: idem.FingerprintOptions{Key: key}}
			if tc.key == nil {
				src.Options.Key = nil
			}
		}
		if got := src.MatchesEarlier(stored); got != tc.want {
			t.Errorf("%s: MatchesEarlier = %v, want %v", tc.why, got, tc.want)
		}
	}
	// A fingerprint of this version, or one that only looks like v1's, is
	// not an earlier one.
	src := &idem.FingerprintSource{Input: json(`{"amount":100}`)}
	for _, stored := range []string{mustFingerprint(t, src.Input, src.Options), "v1:", "v1:00", "v1", "v0:abc", ""} {
		if src.MatchesEarlier(stored) {
			t.Errorf("MatchesEarlier(%q) = true", stored)
		}
	}
}

// TestRetryAcrossUpgrade: records reserved by v1 (completed or in flight)
// give a retry by this version their answer or 409, not a false 422, and a
// request v1 confused with another one gets 422.
func TestRetryAcrossUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := idemmem.MustNew(idemmem.Config{})
	defer st.Close()
	e, err := idem.NewEngine(st, idem.EngineConfig{})
	if err != nil {
		t.Fatal(err)
	}
	idem.SetHeartbeatLinger(e, 0)
	in := func(body string) idem.FingerprintInput {
		return idem.FingerprintInput{Method: "POST", Operation: "POST /pay", Path: "/pay", ContentType: "application/json", Body: []byte(body)}
	}
	// v1 reserves "done" (and completes it) and "busy", each with a body.
	reserveV1 := func(key, body string) *idem.Lease {
		fp, err := idem.FingerprintV1(in(body), idem.FingerprintOptions{})
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.Begin(ctx, idem.Request{Key: idem.Key{Scope: "s", Operation: "POST /pay", Key: key}, Fingerprint: fp})
		if err != nil || res.Outcome != idem.Acquired {
			t.Fatalf("%s: %v %v", key, res.Outcome, err)
		}
		return res.Lease
	}
	if err := reserveV1("done", `{"amount":100,"currency":"usd"}`).Complete(ctx, &idem.Response{Status: 201, Body: []byte("paid")}); err != nil {
		t.Fatal(err)
	}
	busy := reserveV1("busy", `{"amount":100}`)
	defer busy.Release(ctx)
	if err := reserveV1("dup", `{"amount":1,"amount":1000}`).Complete(ctx, &idem.Response{Status: 201, Body: []byte("paid 1000")}); err != nil {
		t.Fatal(err)
	}

	begin := func(key, body string, source bool) idem.Outcome {
		t.Helper()
		src := &idem.FingerprintSource{Input: in(body)}
		req := idem.Request{Key: idem.Key{Scope: "s", Operation: "POST /pay", Key: key}, Fingerprint: mustFingerprint(t, src.Input, src.Options)}
		if source {
			req.FingerprintSource = src
		}
		res, err := e.Begin(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome == idem.Replayed && string(res.Response.Body) != "paid" {
			t.Fatalf("%s: replayed %q", key, res.Response.Body)
		}
		return res.Outcome
	}
	cases := []struct {
		key, body string
		source    bool
		want      idem.Outcome
	}{
		{"done", `{"currency":"usd","amount":100}`, true, idem.Replayed},
		{"done", `{"currency":"usd","amount":100}`, false, idem.Mismatch},
		{"done", `{"currency":"usd","amount":101}`, true, idem.Mismatch},
		{"busy", `{"amount":100}`, true, idem.InFlight},
		{"busy", `{"amount":99}`, true, idem.Mismatch},
		{"dup", `{"amount":1000,"amount":1}`, true, idem.Mismatch},
	}
	for _, tc := range cases {
		if got := begin(tc.key, tc.body, tc.source); got != tc.want {
			t.Errorf("%s with %s (source %v): %v, want %v", tc.key, tc.body, tc.source, got, tc.want)
		}
	}
}

// TestMiddlewareRetryAcrossUpgrade: through the middleware, a retry of a
// request that v1 stored gets the stored answer, and the handler does not
// run again.
func TestMiddlewareRetryAcrossUpgrade(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, paymentHandler)
	const body = `{"amount":100,"currency":"usd"}`
	fp, err := idem.FingerprintV1(idem.FingerprintInput{Method: "POST", Operation: "POST /payments", Path: "/payments",
		ContentType: "application/json", Body: []byte(body)}, idem.FingerprintOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := f.e.Begin(t.Context(), idem.Request{Key: idem.Key{Scope: "user:alice", Operation: "POST /payments", Key: "k"}, Fingerprint: fp})
	if err != nil || res.Outcome != idem.Acquired {
		t.Fatal(res.Outcome, err)
	}
	if err := res.Lease.Complete(t.Context(), &idem.Response{Status: 201, Body: []byte(`{"id":"pay_v1"}`)}); err != nil {
		t.Fatal(err)
	}
	w := f.do(call{key: "k", body: body})
	if w.Code != 201 || w.Body.String() != `{"id":"pay_v1"}` || f.runs.Load() != 0 {
		t.Fatalf("retry: %d %s, the handler ran %d times", w.Code, w.Body, f.runs.Load())
	}
	w = f.do(call{key: "k", body: strings.Replace(body, "100", "999", 1)})
	if w.Code != 422 || f.runs.Load() != 0 {
		t.Fatalf("another request: %d %s, the handler ran %d times", w.Code, w.Body, f.runs.Load())
	}
}

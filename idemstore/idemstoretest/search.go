package idemstoretest

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// testSearch checks ListParams' search fields (Key, KeyPrefix,
// ScopeLabels, OlderThan, Reason, Order), the scope label a record keeps,
// and Counts, on stores whose Capabilities include Search.
func testSearch(t *testing.T, h Harness) {
	s := h.New(t)
	if !s.Capabilities().Search {
		t.Run("Refused", func(t *testing.T) {
			// A store that cannot search must say so, never list
			// unfiltered: an operator would act on keys they did not ask for.
			_, err := s.List(t.Context(), idemstore.ListParams{Key: "k"})
			if err == nil {
				t.Skip("the store does not report Capabilities.Search; idemadmin refuses searches on it")
			}
			requireErrIs(t, err, idemstore.ErrSearchUnsupported, "List with Key on a store without Search")
		})
		return
	}
	t.Run("KeyAcrossScopes", func(t *testing.T) { t.Parallel(); testSearchKey(t, s) })
	t.Run("KeyHostile", func(t *testing.T) { t.Parallel(); testSearchHostile(t, s) })
	t.Run("KeyPrefix", func(t *testing.T) { t.Parallel(); testSearchPrefix(t, s) })
	t.Run("ScopeLabel", func(t *testing.T) { t.Parallel(); testSearchLabel(t, s) })
	t.Run("Reason", func(t *testing.T) { t.Parallel(); testSearchReason(t, s) })
	t.Run("Order", func(t *testing.T) { t.Parallel(); testSearchOrder(t, s) })
	t.Run("OlderThan", func(t *testing.T) { t.Parallel(); testSearchOlderThan(t, s) })
	t.Run("Counts", func(t *testing.T) { t.Parallel(); testCounts(t, h.New(t)) })
}

// listAll pages through p with limit, requiring every page to be within
// it, and returns every record in the order listed.
func listAll(t *testing.T, f *fixture, p idemstore.ListParams) []*idemstore.Record {
	t.Helper()
	var out []*idemstore.Record
	for page := 0; ; page++ {
		if page > 200 {
			t.Fatalf("List(%+v): more than 200 pages; does NextCursor advance?", p)
		}
		res, err := f.s.List(f.ctx(), p)
		if err != nil {
			t.Fatalf("List(%+v) page %d: %v", p, page, err)
		}
		if n := p.Normalize().Limit; len(res.Records) > n {
			t.Fatalf("List(%+v) page %d: %d records, over the limit %d", p, page, len(res.Records), n)
		}
		if len(res.Records) == 0 && res.NextCursor != "" {
			t.Fatalf("List(%+v) page %d: an empty page with a NextCursor", p, page)
		}
		for _, r := range res.Records {
			checkUTC(t, r)
		}
		out = append(out, res.Records...)
		if res.NextCursor == "" {
			return out
		}
		p.Cursor = res.NextCursor
	}
}

// keysOf returns the keys of recs, in order.
func keysOf(recs []*idemstore.Record) []idemstore.Key {
	out := make([]idemstore.Key, len(recs))
	for i, r := range recs {
		out[i] = r.Key
	}
	return out
}

// byKeyValue orders keys as a search by key value lists them.
func byKeyValue(a, b idemstore.Key) int {
	return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Operation, b.Operation))
}

// requireListed requires a listing of p, at every page size, to hold
// exactly want, in the order cmpKeys gives (nil: any order).
func requireListed(t *testing.T, f *fixture, p idemstore.ListParams, want []idemstore.Key, cmpKeys func(a, b idemstore.Key) int) {
	t.Helper()
	for _, limit := range []int{1, 2, 3, 1000} {
		p.Limit = limit
		got := keysOf(listAll(t, f, p))
		what := fmt.Sprintf("List(Key %q, KeyPrefix %q, State %q, Operation %q, Labels %q, Reason %q, Limit %d)",
			p.Key, p.KeyPrefix, p.State, p.Operation, p.ScopeLabels, p.Reason, limit)
		requireSameKeys(t, what, got, want)
		if cmpKeys != nil && !slices.IsSortedFunc(got, cmpKeys) {
			t.Fatalf("%s: listed out of order: %q", what, got)
		}
	}
}

func testSearchKey(t *testing.T, s idemstore.Store) {
	f := newFixture(t, s)
	v := "order-" + randomHex(6)
	var all, review, completed, second []idemstore.Key
	for i, scope := range []string{f.scope + "-b", f.scope + "-a", f.scope + "-c"} {
		for j, op := range []string{"POST /payments", "POST /refunds"} {
			k := idemstore.Key{Scope: scope, Operation: op, Key: v}
			rec := f.reserve(k, leaseExpired)
			switch (i + j) % 3 {
			case 1:
				f.escalate(rec, "check")
				review = append(review, k)
			case 2:
				f.complete(rec, jsonResponse(`{}`), retainLive)
				completed = append(completed, k)
			}
			if j == 1 {
				second = append(second, k)
			}
			all = append(all, k)
		}
	}
	// Look-alikes that an exact search must leave out.
	for _, other := range []string{v + "x", "x" + v, strings.ToUpper(v), v + " ", v[:len(v)-1]} {
		f.reserve(idemstore.Key{Scope: f.scope + "-a", Operation: "POST /payments", Key: other}, leaseLive)
	}
	requireListed(t, f, idemstore.ListParams{Key: v}, all, byKeyValue)
	requireListed(t, f, idemstore.ListParams{Key: v, State: idemstore.StateNeedsReview}, review, byKeyValue)
	requireListed(t, f, idemstore.ListParams{Key: v, State: idemstore.StateCompleted}, completed, byKeyValue)
	requireListed(t, f, idemstore.ListParams{Key: v, Operation: "POST /refunds"}, second, byKeyValue)
	requireListed(t, f, idemstore.ListParams{Key: "order-" + randomHex(6)}, nil, nil)
	// In an order by age too.
	requireListed(t, f, idemstore.ListParams{Key: v, Order: idemstore.OrderOldest}, all, nil)
}

func testSearchHostile(t *testing.T, s idemstore.Store) {
	f := newFixture(t, s)
	u := randomHex(4)
	keys := []string{
		u + "%", u + "%x", u + "_", u + "ab", u + "a_", u + `\`, u + `\%`, u + `'`, u + `"`, u + `''`,
		u + "*", u + "[a]", u + "é", u + "éa", u + "~", u + "~~",
		u + strings.Repeat("z", idemstore.MaxKeyLength-len(u)),
	}
	for _, k := range keys {
		f.reserve(f.key(k), leaseLive)
	}
	for _, k := range keys {
		requireListed(t, f, idemstore.ListParams{Key: k}, []idemstore.Key{f.key(k)}, nil)
	}
	withPrefix := func(p string) []idemstore.Key {
		var out []idemstore.Key
		for _, k := range keys {
			if strings.HasPrefix(k, p) {
				out = append(out, f.key(k))
			}
		}
		return out
	}
	// Wildcards of LIKE and GLOB, escapes and quotes are plain characters.
	for _, p := range []string{u + "%", u + "_", u + "a", u + `\`, u + `'`, u + "[", u + "*", u + "é", u + "~", u + "z", u} {
		requireListed(t, f, idemstore.ListParams{KeyPrefix: p}, withPrefix(p), byKeyValue)
	}
	// A key no store can hold (NUL, invalid UTF-8) finds nothing, and is
	// no error; so does a prefix that is not valid UTF-8, though it is
	// one of valid keys' bytes.
	for _, k := range []string{u + "\x00", u + "\xff", u + "\xc3"} {
		requireListed(t, f, idemstore.ListParams{Key: k}, nil, nil)
		requireListed(t, f, idemstore.ListParams{KeyPrefix: k}, nil, nil)
	}
	// A key longer than any stored one finds nothing.
	requireListed(t, f, idemstore.ListParams{Key: strings.Repeat("k", 4*idemstore.MaxKeyLength)}, nil, nil)
}

func testSearchPrefix(t *testing.T, s idemstore.Store) {
	f := newFixture(t, s)
	u := "inv-" + randomHex(4) + "-"
	in := []idemstore.Key{
		f.key(u + "1"), f.key(u + "10"), f.key(u + "1x"),
		{Scope: f.scope + "-other", Operation: "POST /refunds", Key: u + "1"},
	}
	out := []idemstore.Key{f.key(u + "2"), f.key("a" + u + "1"), f.key(u[:len(u)-1])}
	for i, k := range slices.Concat(in, out) {
		rec := f.reserve(k, leaseExpired)
		if i%2 == 0 {
			f.escalate(rec, "check")
		}
	}
	requireListed(t, f, idemstore.ListParams{KeyPrefix: u + "1"}, in, byKeyValue)
	requireListed(t, f, idemstore.ListParams{KeyPrefix: u + "1", State: idemstore.StateNeedsReview}, []idemstore.Key{in[0], in[2]}, byKeyValue)
	requireListed(t, f, idemstore.ListParams{KeyPrefix: u + "1", Key: u + "10"}, []idemstore.Key{in[1]}, nil)
	requireListed(t, f, idemstore.ListParams{KeyPrefix: u + "1", Order: idemstore.OrderNewest}, in, nil)
	// An empty prefix does not filter, and pages stay within the limit.
	res, err := f.s.List(f.ctx(), idemstore.ListParams{KeyPrefix: "", Limit: 2})
	if err != nil || len(res.Records) != 2 || res.NextCursor == "" {
		t.Fatalf("List(KeyPrefix \"\", Limit 2) = %d records, cursor %q, %v; want 2 and a next page", len(res.Records), res.NextCursor, err)
	}
}

func testSearchLabel(t *testing.T, s idemstore.Store) {
	f := newFixture(t, s)
	u := "acct_" + randomHex(4)
	sealed := func(digest, blob string) string { return idemstore.SealedLabelPrefix + digest + ":" + blob }
	long := sealed(u, strings.Repeat("B", idemstore.MaxStoredScopeLabelLength-len(idemstore.SealedLabelPrefix)-len(u)-1))
	labels := map[string]string{
		"a": u, "b": u, "c": u + "0", "d": strings.ToUpper(u), "e": u + " x",
		"f": sealed(u+"d1", "blob-1"), "g": sealed(u+"d1", "blob-2"), "h": sealed(u+"d2", "blob-1"),
		"i": long, "j": "",
		"k": "ünï 用户 🔑 %_\\'\"", "l": strings.Repeat("é", idemstore.MaxScopeLabelLength/2),
	}
	keys := map[string]idemstore.Key{}
	for name, label := range labels {
		k := idemstore.Key{Scope: f.scope + "-" + name, Operation: "POST /payments", Key: u + "-" + name}
		keys[name] = k
		rec := f.reserveWith(idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: newToken(), Lease: leaseExpired, ScopeLabel: label})
		if rec.ScopeLabel != label {
			t.Fatalf("Reserve with ScopeLabel %q: stored %q", label, rec.ScopeLabel)
		}
		// Every later change keeps the label (diffRecord compares it).
		switch name {
		case "a":
			f.escalate(rec, "check")
		case "b":
			f.complete(rec, jsonResponse(`{}`), retainLive)
		}
	}
	named := func(names ...string) []idemstore.Key {
		var out []idemstore.Key
		for _, n := range names {
			out = append(out, keys[n])
		}
		return out
	}
	requireListed(t, f, idemstore.ListParams{ScopeLabels: []string{u}}, named("a", "b"), nil)
	requireListed(t, f, idemstore.ListParams{ScopeLabels: []string{u}, State: idemstore.StateCompleted}, named("b"), nil)
	requireListed(t, f, idemstore.ListParams{ScopeLabels: []string{u, u + "0"}}, named("a", "b", "c"), nil)
	requireListed(t, f, idemstore.ListParams{ScopeLabels: []string{idemstore.SealedLabelPrefix + u + "d1"}}, named("f", "g"), nil)
	requireListed(t, f, idemstore.ListParams{ScopeLabels: []string{idemstore.SealedLabelPrefix + u, u}}, named("a", "b", "i"), nil)
	requireListed(t, f, idemstore.ListParams{ScopeLabels: []string{labels["k"]}}, named("k"), nil)
	requireListed(t, f, idemstore.ListParams{ScopeLabels: []string{labels["l"]}}, named("l"), nil)
	requireListed(t, f, idemstore.ListParams{ScopeLabels: []string{u[:len(u)-1]}}, nil, nil)
	// Labels are kept as given through a resolution too.
	rec := f.get(keys["a"])
	if err := f.s.Resolve(f.ctx(), idemstore.ResolveParams{Key: rec.Key, Action: idemstore.ResolveComplete, Response: jsonResponse(`{}`), Retention: retainLive}); err != nil {
		t.Fatal(err)
	}
	if got := f.get(keys["a"]).ScopeLabel; got != u {
		t.Fatalf("after Resolve, ScopeLabel %q, want %q", got, u)
	}
	if got := f.get(keys["i"]).ScopeLabel; got != long {
		t.Fatalf("a label of %d bytes was stored as %d bytes", len(long), len(got))
	}
}

func testSearchReason(t *testing.T, s idemstore.Store) {
	f := newFixture(t, s)
	u := randomHex(4)
	reasons := []string{
		"upstream TIMEOUT after the request was sent " + u,
		"connection reset by peer " + u,
		"50% done " + u,
		"500 done " + u,
		"a_b " + u,
		"axb " + u,
		`quote ' and \ ` + u,
	}
	var keys []idemstore.Key
	for i, r := range reasons {
		rec := f.reserve(f.key(fmt.Sprintf("%s-%d", u, i)), leaseExpired)
		f.escalate(rec, r)
		keys = append(keys, rec.Key)
	}
	for _, c := range []struct {
		q    string
		want []int
	}{
		{"timeout", []int{0}},
		{"Timeout After", []int{0}},
		{"RESET", []int{1}},
		{"50%", []int{2}},
		{"0% d", []int{2}},
		{"a_b", []int{4}},
		{`' and \`, []int{6}},
		{u, []int{0, 1, 2, 3, 4, 5, 6}},
		{"nothing like it " + u, nil},
	} {
		var want []idemstore.Key
		for _, i := range c.want {
			want = append(want, keys[i])
		}
		requireListed(t, f, idemstore.ListParams{Reason: c.q, State: idemstore.StateNeedsReview, Order: idemstore.OrderOldest}, want, nil)
	}
}

// byAge orders records as OrderOldest lists them.
func byAge(a, b *idemstore.Record) int {
	return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.Key.Scope, b.Key.Scope),
		cmp.Compare(a.Key.Operation, b.Key.Operation), cmp.Compare(a.Key.Key, b.Key.Key))
}

func testSearchOrder(t *testing.T, s idemstore.Store) {
	f := newFixture(t, s)
	u := "ord-" + randomHex(4)
	// Records reserved in quick succession share a CreatedAt at the
	// store's precision: ties are broken by scope, operation and key.
	var review []idemstore.Key
	for i := range 12 {
		k := idemstore.Key{Scope: fmt.Sprintf("%s-%02d", f.scope, (i*7)%12), Operation: "POST /payments", Key: u}
		rec := f.reserve(k, leaseExpired)
		if i%3 != 0 {
			f.escalate(rec, "check")
			review = append(review, k)
		}
	}
	for _, st := range []idemstore.State{"", idemstore.StateNeedsReview} {
		for _, limit := range []int{1, 2, 5, 1000} {
			p := idemstore.ListParams{Key: u, State: st, Order: idemstore.OrderOldest, Limit: limit}
			oldest := listAll(t, f, p)
			if !slices.IsSortedFunc(oldest, byAge) {
				t.Fatalf("List(OrderOldest, State %q, Limit %d): out of order: %v", st, limit, describeAges(oldest))
			}
			p.Order = idemstore.OrderNewest
			newest := listAll(t, f, p)
			slices.Reverse(newest)
			if !slices.Equal(keysOf(newest), keysOf(oldest)) {
				t.Fatalf("List(OrderNewest, State %q, Limit %d) is not OrderOldest reversed:\n%v\n%v", st, limit, describeAges(newest), describeAges(oldest))
			}
			if st == idemstore.StateNeedsReview {
				requireSameKeys(t, "List(needs_review, OrderOldest)", keysOf(oldest), review)
			} else if len(oldest) != 12 {
				t.Fatalf("List(OrderOldest, Limit %d) listed %d records, want 12", limit, len(oldest))
			}
		}
	}
	// Every state's listing, by age, without a key: our records are among
	// them, in order.
	recs := listAll(t, f, idemstore.ListParams{State: idemstore.StateNeedsReview, Order: idemstore.OrderOldest, Limit: 4})
	if !slices.IsSortedFunc(recs, byAge) {
		t.Fatalf("List(needs_review, OrderOldest): out of order: %v", describeAges(recs))
	}
	// A cursor of one order is not one of another.
	res, err := f.s.List(f.ctx(), idemstore.ListParams{Key: u, Limit: 1})
	if err != nil || res.NextCursor == "" {
		t.Fatalf("List(Limit 1): %v, cursor %q", err, res.NextCursor)
	}
	_, err = f.s.List(f.ctx(), idemstore.ListParams{Key: u, Limit: 1, Order: idemstore.OrderOldest, Cursor: res.NextCursor})
	requireErrIs(t, err, idemstore.ErrBadCursor, "List(OrderOldest) with a cursor of OrderKey")
}

func describeAges(recs []*idemstore.Record) string {
	var b strings.Builder
	for _, r := range recs {
		fmt.Fprintf(&b, "\n  %s %s", r.CreatedAt.Format(time.RFC3339Nano), r.Key.Scope)
	}
	return b.String()
}

func testSearchOlderThan(t *testing.T, s idemstore.Store) {
	f := newFixture(t, s)
	u := "age-" + randomHex(4)
	old := f.reserve(f.key(u+"-old"), leaseLive)
	// Read the record until the store's clock (no fake clock reaches a
	// real server's) has moved past twice the age asked for.
	const age = 5 * time.Millisecond
	for i := 0; f.get(old.Key).ReadAt.Sub(old.CreatedAt) < 2*age; i++ {
		if i > 1_000_000 {
			t.Fatal("the store's clock did not move in a million reads")
		}
	}
	requireListed(t, f, idemstore.ListParams{KeyPrefix: u, OlderThan: age}, []idemstore.Key{old.Key}, nil)
	requireListed(t, f, idemstore.ListParams{KeyPrefix: u, OlderThan: time.Hour}, nil, nil)
	requireListed(t, f, idemstore.ListParams{KeyPrefix: u, OlderThan: 0}, []idemstore.Key{old.Key}, nil)
	_, err := f.s.List(f.ctx(), idemstore.ListParams{OlderThan: -time.Second})
	if err == nil {
		t.Fatal("List(OlderThan -1s): no error")
	}
}

func testCounts(t *testing.T, s idemstore.Store) {
	c, ok := s.(idemstore.Counter)
	if !ok {
		t.Skip("the store does not implement idemstore.Counter")
	}
	f := newFixture(t, s)
	got, err := c.Counts(f.ctx())
	if err != nil {
		t.Fatal(err)
	}
	if got.Pending != 0 || got.NeedsReview != 0 || got.Completed != 0 || len(got.Operations) != 0 || !got.OldestNeedsReview.IsZero() {
		t.Fatalf("Counts of an empty store = %+v", got)
	}
	pop := populate(f)
	var oldest time.Time
	for _, k := range pop.review {
		if r := f.get(k); oldest.IsZero() || r.CreatedAt.Before(oldest) {
			oldest = r.CreatedAt
		}
	}
	got, err = c.Counts(f.ctx())
	if err != nil {
		t.Fatal(err)
	}
	pending := int64(len(pop.byState(idemstore.StatePending)))
	if got.Pending != pending || got.NeedsReview != int64(len(pop.review)) {
		t.Fatalf("Counts: %d pending, %d in review; want %d, %d", got.Pending, got.NeedsReview, pending, len(pop.review))
	}
	if got.Completed != int64(len(pop.completed)) || got.CompletedEstimated {
		t.Fatalf("Counts: %d completed (estimated %v); want %d exactly (under ExactCountLimit)", got.Completed, got.CompletedEstimated, len(pop.completed))
	}
	// populate's open records are all of one operation.
	want := []idemstore.OperationCounts{{Operation: f.key("").Operation, Pending: pending, NeedsReview: int64(len(pop.review))}}
	if !slices.Equal(got.Operations, want) {
		t.Fatalf("Counts.Operations = %+v, want %+v", got.Operations, want)
	}
	if !sameInstant(got.OldestNeedsReview, oldest) {
		t.Fatalf("Counts.OldestNeedsReview = %v, want %v", got.OldestNeedsReview, oldest)
	}
	if got.ReadAt.Before(oldest) || got.ReadAt.Location() != time.UTC {
		t.Fatalf("Counts.ReadAt = %v, before the oldest record %v, or not UTC", got.ReadAt, oldest)
	}
}

package idemadmin_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemadmin"
)

// TestAPISearch: GET /api/v1/keys takes the search parameters, refuses
// unknown, repeated and malformed ones, and a key found by its value is
// reachable by its short ID; GET /api/v1/counts counts.
func TestAPISearch(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, scope := range []string{"tenant-1", "tenant-2"} {
		f.review(idem.Key{Scope: scope, Operation: "POST /payments", Key: "order/1001%"})
	}
	f.complete(idem.Key{Scope: "tenant-1", Operation: "POST /payments", Key: "order/1001x"})
	list := func(query string) idemadmin.Page {
		t.Helper()
		a := f.api("GET", "/api/v1/keys?"+query, opsToken, "")
		wantStatus(t, query, a, 200)
		var p idemadmin.Page
		a.decode(t, &p)
		return p
	}
	if p := list("key=" + url.QueryEscape("order/1001%")); len(p.Items) != 2 || p.Order != "key" {
		t.Fatalf("key=order/1001%%: %d items, order %s", len(p.Items), p.Order)
	}
	if p := list("key_prefix=order%2F1001&state=completed"); len(p.Items) != 1 || p.Items[0].Key != "order/1001x" {
		t.Fatalf("key_prefix with state: %+v", p.Items)
	}
	if p := list("key_prefix=order%2F1001_"); len(p.Items) != 0 {
		t.Fatalf("'_' is a character, not a wildcard: %d items", len(p.Items))
	}
	if p := list("reason=CONNECTION+reset&older_than=0s&order=newest"); len(p.Items) != 2 || p.Order != "newest" {
		t.Fatalf("reason: %d items, order %s", len(p.Items), p.Order)
	}
	if p := list("older_than=48h"); len(p.Items) != 0 {
		t.Fatalf("older_than=48h: %d items", len(p.Items))
	}
	if p := list("state=needs_review"); p.Order != "oldest" {
		t.Fatalf("the review queue's order %s, want oldest", p.Order)
	}
	for _, bad := range []string{"kye=order", "key=a&key=b", "older_than=1d", "older_than=-1h", "order=age", "limit=x", "key_prefix=" + strings.Repeat("%00", 300)} {
		a := f.api("GET", "/api/v1/keys?"+bad, opsToken, "")
		wantStatus(t, bad, a, 400)
	}

	// A short id with a '/' and a '%' in its key, escaped in the path.
	p := list("key=" + url.QueryEscape("order/1001%") + "&limit=1")
	short := p.Items[0].ShortID
	a := f.api("GET", "/api/v1/keys/"+url.PathEscape(short), opsToken, "")
	wantStatus(t, "GET by short id", a, 200)
	var it idemadmin.Item
	a.decode(t, &it)
	if it.ID != p.Items[0].ID {
		t.Fatalf("GET %s found %s, want %s", short, it.ID, p.Items[0].ID)
	}

	a = f.api("GET", "/api/v1/counts", opsToken, "")
	wantStatus(t, "counts", a, 200)
	var c idemadmin.Counts
	a.decode(t, &c)
	if c.NeedsReview != 2 || c.Completed != 1 || c.OldestNeedsReview == nil || c.OldestNeedsReview.Key != "order/1001%" {
		t.Fatalf("counts %+v", c)
	}
	wantStatus(t, "counts without a token", f.api("GET", "/api/v1/counts", "", ""), 401)

	// The client sends every filter, and reads the counts.
	cl, err := idemadmin.NewClient(f.srv.URL, opsToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	page, err := cl.List(context.Background(), idemadmin.ListQuery{Key: "order/1001%", State: "needs_review", OlderThan: time.Nanosecond, Reason: "reset", Order: "newest", Limit: 1})
	if err != nil || len(page.Items) != 1 || page.NextCursor == "" || page.Order != "newest" {
		t.Fatalf("Client.List: %d items, cursor %q, order %s, %v", len(page.Items), page.NextCursor, page.Order, err)
	}
	if cc, err := cl.Counts(context.Background()); err != nil || cc.NeedsReview != 2 {
		t.Fatalf("Client.Counts = %+v, %v", cc, err)
	}
}

// TestListQueryValuesRoundTrip: what Values writes, ParseListQuery reads.
func TestListQueryValuesRoundTrip(t *testing.T) {
	t.Parallel()
	q := idemadmin.ListQuery{State: "needs_review", Operation: "POST /x", Key: "k%_", KeyPrefix: "p&=", OlderThan: 90 * time.Minute,
		Reason: "r e", Label: "l+1", Order: "newest", Cursor: "c", Limit: 7}
	got, err := idemadmin.ParseListQuery(q.Values())
	if err != nil || got != q {
		t.Fatalf("ParseListQuery(Values) = %+v, %v; want %+v", got, err, q)
	}
}

package idemadmin

import (
	"cmp"
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

var stateLabels = []struct{ state, label string }{
	{string(idemstore.StateNeedsReview), "Needs review"},
	{string(idemstore.StatePending), "In flight"},
	{string(idemstore.StateCompleted), "Completed"},
}

// searchForm is the queue's search form, as the page's query gives it.
type searchForm struct {
	Find, Match, State, Operation, OlderThan, Reason, Label string
	// Open keeps the form's more filters open: one of them is set.
	Open bool
}

// query reads the page's search into a ListQuery.
func (f searchForm) query(cursor string) (ListQuery, error) {
	v := url.Values{}
	set := func(name, val string) {
		if val != "" {
			v.Set(name, val)
		}
	}
	find := strings.TrimSpace(f.Find)
	if f.Match == "prefix" {
		set("key_prefix", find)
	} else {
		set("key", find)
	}
	set("operation", strings.TrimSpace(f.Operation))
	set("reason", strings.TrimSpace(f.Reason))
	set("label", strings.TrimSpace(f.Label))
	set("cursor", cursor)
	if s := strings.TrimSpace(f.OlderThan); s != "" {
		// An age as operators write it: 90m, 2h, 3d.
		if n, ok := strings.CutSuffix(s, "d"); ok {
			if d, err := time.ParseDuration(n + "h"); err == nil {
				s = (d * 24).String()
			}
		}
		v.Set("older_than", s)
	}
	if f.State != "any" {
		set("state", f.State)
	}
	return ParseListQuery(v)
}

// searching reports whether the form searches (more than a state tab).
func (f searchForm) searching() bool {
	return f.Find != "" || f.Operation != "" || f.OlderThan != "" || f.Reason != "" || f.Label != ""
}

// values returns the form as the page's query, with cursor.
func (f searchForm) values(cursor string) url.Values {
	v := url.Values{}
	for name, val := range map[string]string{"find": f.Find, "match": f.Match, "state": f.State, "operation": f.Operation,
		"older_than": f.OlderThan, "reason": f.Reason, "label": f.Label, "cursor": cursor} {
		if val != "" {
			v.Set(name, val)
		}
	}
	return v
}

func (h *Handler) queue(w http.ResponseWriter, r *http.Request, sess *session) {
	q := r.URL.Query()
	f := searchForm{Find: q.Get("find"), Match: q.Get("match"), State: q.Get("state"), Operation: q.Get("operation"),
		OlderThan: q.Get("older_than"), Reason: q.Get("reason"), Label: q.Get("label")}
	f.Open = f.Operation != "" || f.OlderThan != "" || f.Reason != "" || f.Label != "" || f.State == "any"
	if f.State == "" {
		f.State = string(idemstore.StateNeedsReview)
		if f.searching() {
			f.State = "any" // a search looks in every state unless told
		}
	}
	v := h.base(w, r, sess, "Keys", "")
	v.Search, v.State, v.Searching = f, f.State, f.searching()
	for _, s := range stateLabels {
		tab := stateTab{Label: s.label, URL: "/?state=" + s.state, Current: s.state == f.State && !v.Searching}
		v.States = append(v.States, tab)
		if tab.Current {
			v.Title = s.label
		}
	}
	if v.Searching {
		v.Title = "Search"
	}
	if !v.Searching && f.State == string(idemstore.StateNeedsReview) && q.Get("cursor") == "" {
		v.Overview = h.overview(r.Context())
	}
	lq, err := f.query(q.Get("cursor"))
	if err == nil {
		lq.Limit = queuePageSize
		var page Page
		if page, err = h.keys.List(r.Context(), lq); err == nil {
			v.Items, v.Order = page.Items, page.Order
			if page.NextCursor != "" {
				v.Next = "/?" + f.values(page.NextCursor).Encode()
			}
		}
	}
	status := http.StatusOK
	if err != nil {
		e := asError(err)
		v.Error, status = "The search did not run: "+e.Detail, e.Status
	}
	h.render(w, status, "queue", v)
}

// overview is what the page opens on: counts per state and operation,
// the key waiting longest in review, and the latest admin actions.
type overview struct {
	Counts *Counts
	// CountsErr says why there are no counts.
	CountsErr string
	// Operations are the operations with open keys, most in review first,
	// at most maxOverviewOperations.
	Operations []OperationCounts
	// MoreOperations counts those left out.
	MoreOperations int
	Actions        []Action
}

// maxOverviewOperations bounds the operations the overview lists.
const maxOverviewOperations = 12

func (h *Handler) overview(ctx context.Context) *overview {
	o := &overview{Actions: h.actions.latest()}
	c, err := h.keys.Counts(ctx)
	if err != nil {
		o.CountsErr = asError(err).Detail
		return o
	}
	o.Counts = &c
	ops := append([]OperationCounts(nil), c.Operations...)
	sortOperations(ops)
	if len(ops) > maxOverviewOperations {
		o.MoreOperations = len(ops) - maxOverviewOperations
		ops = ops[:maxOverviewOperations]
	}
	o.Operations = ops
	return o
}

// sortOperations orders operations by keys in review, then in flight,
// then by name.
func sortOperations(ops []OperationCounts) {
	slices.SortFunc(ops, func(a, b OperationCounts) int {
		return cmp.Or(cmp.Compare(b.NeedsReview, a.NeedsReview), cmp.Compare(b.Pending, a.Pending), strings.Compare(a.Operation, b.Operation))
	})
}

// Package searchbench measures the admin searches of a store at scale:
// the stores' TestSearchAtScale load a million records (ten thousand in
// review) into a schema, database or file of their own, then time the
// searches an operator makes through Store.List and Counts, and print the
// query plans. scripts/bench-admin.sh runs them; they skip unless
// IDEM_BENCH_SEARCH is set.
package searchbench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// The population every store loads: Records records, one in ReviewEvery
// in review (the rest completed), created over the last day, under
// Scopes scopes; record i has key "order-" + (i % KeyModulo), so that
// some keys are in two scopes, and label "acct_" + (i % Labels).
const (
	Records     = 1_000_000
	ReviewEvery = 100
	Scopes      = 5000
	KeyModulo   = 900_001
	Labels      = 20_000
)

// Scope is the scope of record i: 48 characters, as long as a keyed
// digest's prefix.
func Scope(i int) string { return fmt.Sprintf("tenant-%041d", i%Scopes) }

// Enabled skips t unless IDEM_BENCH_SEARCH is set, and returns the number
// of runs each measurement takes (IDEM_BENCH_SEARCH_RUNS, default 21).
func Enabled(t *testing.T) int {
	t.Helper()
	if os.Getenv("IDEM_BENCH_SEARCH") == "" {
		t.Skip("set IDEM_BENCH_SEARCH=1 to load a million records and time the admin searches (scripts/bench-admin.sh)")
	}
	runs, err := strconv.Atoi(os.Getenv("IDEM_BENCH_SEARCH_RUNS"))
	if err != nil || runs < 1 {
		runs = 21
	}
	return runs
}

// Search is one measured search.
type Search struct {
	Name string
	// List, when set, is what the search lists; else Counts is measured.
	List *idemstore.ListParams
	// Want is the fewest records the search must find.
	Want int
}

// Searches are the searches every store is timed on.
func Searches() []Search {
	return []Search{
		{Name: "key (in 2 scopes)", List: &idemstore.ListParams{Key: "order-12345"}, Want: 2},
		{Name: "oldest 50 in review", List: &idemstore.ListParams{State: idemstore.StateNeedsReview, Order: idemstore.OrderOldest, Limit: 50}, Want: 50},
		{Name: "oldest 50 in review, older than 1h, reason", List: &idemstore.ListParams{State: idemstore.StateNeedsReview, Order: idemstore.OrderOldest, OlderThan: time.Hour, Reason: "timeout", Limit: 50}, Want: 50},
		{Name: "key prefix (100 of 122)", List: &idemstore.ListParams{KeyPrefix: "order-1234", Limit: 100}, Want: 100},
		{Name: "label (50)", List: &idemstore.ListParams{ScopeLabels: []string{"acct_777"}, Limit: 100}, Want: 50},
		{Name: "newest 100", List: &idemstore.ListParams{Order: idemstore.OrderNewest, Limit: 100}, Want: 100},
		{Name: "counts", Want: 0},
	}
}

// Measure runs each search runs times on s, after one warm-up, and
// reports the median and the slowest run in milliseconds.
func Measure(t *testing.T, store string, s idemstore.Store, runs int) {
	t.Helper()
	ctx := context.Background()
	for _, sr := range Searches() {
		once := func() int {
			if sr.List == nil {
				c, err := s.(idemstore.Counter).Counts(ctx)
				if err != nil {
					t.Fatalf("%s: %s: %v", store, sr.Name, err)
				}
				if c.NeedsReview != Records/ReviewEvery {
					t.Fatalf("%s: counts: %d in review, want %d", store, c.NeedsReview, Records/ReviewEvery)
				}
				return 0
			}
			page, err := s.List(ctx, *sr.List)
			if err != nil {
				t.Fatalf("%s: %s: %v", store, sr.Name, err)
			}
			return len(page.Records)
		}
		if n := once(); n < sr.Want {
			t.Fatalf("%s: %s found %d records, want at least %d", store, sr.Name, n, sr.Want)
		}
		times := make([]float64, runs)
		for i := range times {
			start := time.Now()
			once()
			times[i] = float64(time.Since(start).Microseconds()) / 1000
		}
		slices.Sort(times)
		fmt.Printf("%-10s %-44s median %8.2f ms   max %8.2f ms   (%d runs)\n", store, sr.Name, times[len(times)/2], times[len(times)-1], runs)
	}
}

// Plans prints the query plan of each list search, as explain returns it.
func Plans(t *testing.T, store string, explain func(p idemstore.ListParams) (string, error)) {
	t.Helper()
	for _, sr := range Searches() {
		if sr.List == nil {
			continue
		}
		plan, err := explain(sr.List.Normalize())
		if err != nil {
			t.Fatalf("%s: explaining %s: %v", store, sr.Name, err)
		}
		fmt.Printf("--- %s plan: %s\n%s\n", store, sr.Name, plan)
	}
}

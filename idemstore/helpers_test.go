package idemstore_test

import (
	"errors"
	"slices"
	"strconv"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

func TestReserveLoop(t *testing.T) {
	t.Parallel()
	rec := &idemstore.Record{State: idemstore.StatePending}
	boom := errors.New("boom")
	cases := []struct {
		name    string
		results []error // nil: vanished; errCreated, errFound: success
		retries int
		calls   int
		wantErr error
	}{
		{"first try", []error{errCreated}, 0, 1, nil},
		{"found at once", []error{errFound}, 0, 1, nil},
		{"vanished then found", []error{nil, nil, errFound}, 0, 3, nil},
		{"vanished then created", []error{nil, errCreated}, 0, 2, nil},
		{"vanishes for ever", []error{nil, nil, nil, nil, nil, nil}, 0, idemstore.MaxReserveAttempts, idemstore.ErrRetryable},
		{"retryable within budget", []error{idemstore.ErrRetryable, errCreated}, 1, 2, nil},
		{"retryable over budget", []error{idemstore.ErrRetryable, idemstore.ErrRetryable}, 1, 2, idemstore.ErrRetryable},
		{"other error at once", []error{boom, errCreated}, 3, 1, boom},
	}
	for _, tc := range cases {
		calls := 0
		got, created, err := idemstore.ReserveLoop("test", tc.retries, func() (*idemstore.Record, bool, error) {
			r := tc.results[calls]
			calls++
			switch r {
			case errCreated:
				return nil, true, nil
			case errFound:
				return rec, false, nil
			case nil:
				return nil, false, nil
			}
			return nil, false, r
		})
		if calls != tc.calls || !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
			t.Errorf("%s: %d calls, err %v; want %d calls, err %v", tc.name, calls, err, tc.calls, tc.wantErr)
		}
		last := tc.results[calls-1]
		if err == nil && (created != (last == errCreated) || (got == rec) != (last == errFound)) {
			t.Errorf("%s: got %v, created %v", tc.name, got, created)
		}
	}
}

var (
	errCreated = errors.New("stands for a created record")
	errFound   = errors.New("stands for an existing record")
)

func TestKeyPage(t *testing.T) {
	t.Parallel()
	recs := make([]*idemstore.Record, 5)
	for i := range recs {
		recs[i] = &idemstore.Record{Key: idemstore.Key{Key: strconv.Itoa(i)}}
	}
	page := idemstore.KeyPage(recs, 4)
	if len(page.Records) != 4 || page.NextCursor == "" {
		t.Fatalf("page of 4 from 5: %d records, cursor %q", len(page.Records), page.NextCursor)
	}
	if k, err := idemstore.DecodeKeyCursor(page.NextCursor); err != nil || k.Key != "3" {
		t.Fatalf("cursor = %+v, %v", k, err)
	}
	if page := idemstore.KeyPage(recs[:3], 4); len(page.Records) != 3 || page.NextCursor != "" {
		t.Fatalf("last page: %d records, cursor %q", len(page.Records), page.NextCursor)
	}
}

func TestPurgeBatches(t *testing.T) {
	t.Parallel()
	left := 25
	calls := 0
	var progress []int
	p := idemstore.PurgeParams{BatchSize: 7, Progress: func(n int) { progress = append(progress, n) }}
	n, err := idemstore.PurgeBatches(t.Context(), p, func() (int, error) {
		calls++
		d := min(left, 7)
		left -= d
		return d, nil
	})
	if n != 25 || err != nil || calls != 4 {
		t.Fatalf("PurgeBatches = %d, %v after %d calls; want 25, nil after 4", n, err, calls)
	}
	if !slices.Equal(progress, []int{7, 14, 21, 25}) {
		t.Fatalf("Progress saw %v, want [7 14 21 25]", progress)
	}
	boom := errors.New("boom")
	n, err = idemstore.PurgeBatches(t.Context(), idemstore.PurgeParams{BatchSize: 7}, func() (int, error) { return 0, boom })
	if n != 0 || !errors.Is(err, boom) {
		t.Fatalf("failing batch: %d, %v", n, err)
	}
}

func TestPageLimit(t *testing.T) {
	for _, tc := range []struct{ in, want int }{
		{-5, 100}, {0, 100}, {1, 1}, {100, 100}, {999, 999}, {1000, 1000}, {1001, 1000}, {1 << 40, 1000},
	} {
		if got := idemstore.PageLimit(tc.in); got != tc.want {
			t.Errorf("PageLimit(%d) = %d, want %d", tc.in, got, tc.want)
		}
		if got := (idemstore.ListParams{Limit: tc.in}).Normalize().Limit; got != tc.want {
			t.Errorf("ListParams{Limit: %d}.Normalize().Limit = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestUnmatched(t *testing.T) {
	t.Parallel()
	wrong := errors.New("wrong state")
	for _, tc := range []struct {
		state, want    idemstore.State
		token, wantTok string
		err            error
	}{
		{idemstore.StateCompleted, idemstore.StateNeedsReview, "t", "", wrong},
		{idemstore.StateNeedsReview, idemstore.StateNeedsReview, "t2", "t1", idemstore.ErrLeaseLost},
		{idemstore.StateNeedsReview, idemstore.StateNeedsReview, "t1", "t1", idemstore.ErrRetryable},
		{idemstore.StateNeedsReview, idemstore.StateNeedsReview, "t1", "", idemstore.ErrRetryable},
	} {
		if got := idemstore.Unmatched(tc.state, tc.token, tc.want, tc.wantTok, wrong); !errors.Is(got, tc.err) {
			t.Errorf("Unmatched(%s, %s, want %s, %q) = %v, want %v", tc.state, tc.token, tc.want, tc.wantTok, got, tc.err)
		}
	}
}

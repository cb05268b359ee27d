package idemmysql_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit/batchtest"
)

// TestBatchCompletesByPosition completes records whose keys are arbitrary
// bytes (not UTF-8, quotes, backslashes, NUL) in one batch, each with its
// own answer and retention, and checks that every record got its own: the
// batched UPDATE joins the keys as a derived table and picks the answers by
// position. With a stale Complete among them, the batch takes the locking
// path, which runs the same statement.
func TestBatchCompletesByPosition(t *testing.T) {
	t.Parallel()
	for _, stale := range []bool{false, true} {
		t.Run(fmt.Sprintf("stale=%v", stale), func(t *testing.T) {
			t.Parallel()
			s, _ := newStore(t, "")
			ctx := t.Context()
			names := []string{"plain", "Case", "case", "quote'\"", "back\\slash", "nul\x00byte", "latin1\xe9", "bad\xff\xfe", "emoji\U0001F600", ""}
			var (
				keys  []idemstore.Key
				calls []func() batchtest.Result
			)
			for i, name := range names {
				k := idemstore.Key{Scope: "scope\xff" + name, Operation: "POST /pay", Key: fmt.Sprintf("k%d-%s", i, name)}
				tok := fmt.Sprintf("tok-%d-%s", i, name)
				if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: time.Minute}); err != nil || !created {
					t.Fatalf("seed %q: %v %v", name, created, err)
				}
				keys = append(keys, k)
				calls = append(calls, batchtest.Complete(ctx, s, k, tok, time.Duration(i+1)*time.Hour))
			}
			if stale {
				calls = append(calls, batchtest.Complete(ctx, s, keys[1], "nobody's", time.Hour))
			}
			got := batchtest.InOneBatch(t, s.Batcher(), calls...)
			for i, name := range names {
				if got[i].Err != nil {
					t.Errorf("Complete %q: %v", name, got[i].Err)
					continue
				}
				rec := get(t, s, keys[i])
				want := fmt.Sprintf("tok-%d-%s", i, name)
				if rec.State != idemstore.StateCompleted || rec.Response == nil || string(rec.Response.Body) != want {
					t.Errorf("%q: state %s, answer %+v; want completed with %q", name, rec.State, rec.Response, want)
				}
				if d := rec.ExpiresAt.Sub(rec.UpdatedAt); d != time.Duration(i+1)*time.Hour {
					t.Errorf("%q: expires %v after completion, want %v", name, d, time.Duration(i+1)*time.Hour)
				}
			}
			if stale && !errors.Is(got[len(names)].Err, idemstore.ErrLeaseLost) {
				t.Errorf("stale Complete: %v, want ErrLeaseLost", got[len(names)].Err)
			}
		})
	}
}

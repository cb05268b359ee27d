package idemmysql_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit/batchtest"
)

// The tests in this file attack the batched Complete (a multi-table UPDATE
// joined to a derived table of the calls' keys) on the real server: which
// rows it looks at and locks, which records its byte comparisons pick, and
// what it writes, with the session settings a caller's DSN may bring.

// dsnVariants are session settings a caller's DSN may bring that touch how
// the server reads the statement's strings.
var dsnVariants = []struct {
	name string
	dsn  string // appended to the test database's DSN
}{
	{"default", ""},
	{"interpolateParams", "&interpolateParams=true"},
	{"collation=utf8mb4_unicode_ci", "&collation=utf8mb4_unicode_ci"},
	{"charset=latin1", "&charset=latin1"},
	{"charset=latin1,interpolateParams", "&charset=latin1&interpolateParams=true"},
}

// newStoreDSN returns a store on a migrated database of its own whose
// handle's DSN has extra appended, and the handle.
func newStoreDSN(tb testing.TB, extra string) (*idemmysql.Store, *sql.DB) {
	tb.Helper()
	_, cfg := newDatabase(tb, "")
	dsn := cfg.FormatDSN()
	if extra != "" && !strings.Contains(dsn, "?") {
		dsn += "?"
		extra = strings.TrimPrefix(extra, "&")
	}
	cfg, err := mysql.ParseDSN(dsn + extra)
	if err != nil {
		tb.Fatal(err)
	}
	db := openDB(tb, cfg)
	s, err := idemmysql.New(db, idemmysql.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	return s, db
}

// seed reserves k under tok and fails the test unless it was created.
func seed(tb testing.TB, s *idemmysql.Store, k idemstore.Key, tok string) {
	tb.Helper()
	if _, created, err := s.Reserve(tb.Context(), idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: time.Hour}); err != nil || !created {
		tb.Fatalf("seed %q/%q/%q: created %v, %v", k.Scope, k.Operation, k.Key, created, err)
	}
}

// completeWith is a Complete of k under tok with resp.
func completeWith(ctx context.Context, s *idemmysql.Store, k idemstore.Key, tok string, resp *idemstore.Response, retention time.Duration) func() batchtest.Result {
	return func() batchtest.Result {
		return batchtest.Result{Err: s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: resp, Retention: retention})}
	}
}

// stored is a record's state, answer and retention (expires_at minus
// updated_at, in milliseconds) read straight from the table.
type stored struct {
	state     string
	response  []byte
	retention sql.NullInt64
}

func readStored(tb testing.TB, db *sql.DB, k idemstore.Key) stored {
	tb.Helper()
	var r stored
	err := db.QueryRowContext(tb.Context(), "SELECT state, response, expires_at - updated_at FROM idem_records WHERE scope = ? AND operation = ? AND `key` = ?",
		[]byte(k.Scope), []byte(k.Operation), []byte(k.Key)).Scan(&r.state, &r.response, &r.retention)
	if err != nil {
		tb.Fatalf("read %q/%q/%q: %v", k.Scope, k.Operation, k.Key, err)
	}
	return r
}

// TestBatchCompleteLocksOnlyItsRows: a batched Complete must not lock
// records it has no business with. Another transaction holds the lock of a
// completed record of another scope; the batch must not wait for it, as
// neither the unbatched Complete nor the former batched statement (a range
// of pending records, or of primary keys) did. On a small table MariaDB
// joins the other way round unless told (a scan of idem_records, looking
// each row up in the derived table's key), which in the optimistic,
// REPEATABLE READ try locks every row and gap of the table: every batch of
// Completes then waits for, and deadlocks with, every other writer. The
// sessions' lock wait timeout is one second, so that a wait shows as an
// error rather than a hang. With a stale Complete, the rerun locking first
// must not wait either.
func TestBatchCompleteLocksOnlyItsRows(t *testing.T) {
	t.Parallel()
	for _, stale := range []bool{false, true} {
		t.Run(fmt.Sprintf("stale=%v", stale), func(t *testing.T) {
			t.Parallel()
			s, db := newStoreDSN(t, "&innodb_lock_wait_timeout=1")
			ctx := t.Context()
			busy := idemstore.Key{Scope: "other", Operation: "POST /charges", Key: "busy"}
			seed(t, s, busy, "b")
			if err := s.Complete(ctx, idemstore.CompleteParams{Key: busy, Token: "b", Response: &idemstore.Response{Status: 200}, Retention: time.Hour}); err != nil {
				t.Fatal(err)
			}
			var keys []idemstore.Key
			for _, name := range []string{"a", "z", "b", "y"} {
				k := batchtest.Key(name)
				seed(t, s, k, "t-"+name)
				keys = append(keys, k)
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			var one int
			if err := tx.QueryRowContext(ctx, "SELECT 1 FROM idem_records WHERE scope = ? AND operation = ? AND `key` = ? FOR UPDATE",
				busy.Scope, busy.Operation, busy.Key).Scan(&one); err != nil {
				t.Fatal(err)
			}
			calls := []func() batchtest.Result{
				batchtest.Complete(ctx, s, keys[0], "t-a", time.Hour),
				batchtest.Complete(ctx, s, keys[1], "t-z", time.Hour),
				batchtest.Complete(ctx, s, keys[2], "t-b", time.Hour),
			}
			if stale {
				calls = append(calls, batchtest.Complete(ctx, s, keys[3], "nobody's", time.Hour))
			}
			got := batchtest.InOneBatch(t, s.Batcher(), calls...)
			for i, r := range got[:3] {
				if r.Err != nil {
					t.Errorf("Complete %d beside a record another transaction holds: %v", i, r.Err)
				}
			}
			if stale && !errors.Is(got[3].Err, idemstore.ErrLeaseLost) {
				t.Errorf("stale Complete: %v, want ErrLeaseLost", got[3].Err)
			}
		})
	}
}

// TestBatchCompleteTwoStores: two stores (two processes) complete the same
// records at once, one under the records' tokens and one under stale ones,
// each in one batch of Completes, Releases and Reserves in its own order of
// calls; the outcome must be the one the calls have alone: no deadlock
// reaches a caller.
func TestBatchCompleteTwoStores(t *testing.T) {
	t.Parallel()
	a, _, cfg := func() (*idemmysql.Store, *sql.DB, *mysql.Config) {
		db, cfg := newDatabase(t, "")
		s, err := idemmysql.New(db, idemmysql.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return s, db, cfg
	}()
	b, err := idemmysql.New(openDB(t, cfg), idemmysql.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const n = 40
	for iter := range 5 {
		var keys []idemstore.Key
		for i := range n {
			k := idemstore.Key{Scope: "tenant", Operation: "POST /x", Key: fmt.Sprintf("%d-%02x", iter, (i*37)%256)}
			seed(t, a, k, "live")
			keys = append(keys, k)
		}
		pa, pb := a.Batcher().Pause(), b.Batcher().Pause()
		resA, resB := make([]batchtest.Result, n), make([]batchtest.Result, n+1)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { resA[i] = batchtest.Complete(ctx, a, keys[i], "live", time.Hour)() })
			pa.Wait(i + 1)
			j := n - 1 - i // b queues in the reverse order
			wg.Go(func() {
				if j%2 == 0 {
					resB[j] = batchtest.Complete(ctx, b, keys[j], "stale", time.Hour)()
				} else {
					resB[j] = batchtest.Result{Err: b.Release(ctx, idemstore.ReleaseParams{Key: keys[j], Token: "stale"})}
				}
			})
			pb.Wait(i + 1)
		}
		wg.Go(func() { resB[n] = batchtest.Reserve(ctx, b, keys[n/2], "late", time.Minute)() })
		pb.Wait(n + 1)
		pa.Resume()
		pb.Resume()
		wg.Wait()
		for i, r := range resA {
			if r.Err != nil {
				t.Fatalf("iteration %d: live Complete %d: %v", iter, i, r.Err)
			}
		}
		for i, r := range resB[:n] {
			if !errors.Is(r.Err, idemstore.ErrLeaseLost) {
				t.Fatalf("iteration %d: stale call %d: %v, want ErrLeaseLost", iter, i, r.Err)
			}
		}
		if r := resB[n]; r.Err != nil || r.Created || r.Record == nil || r.Record.Token != "live" {
			t.Fatalf("iteration %d: Reserve of a held key: %+v", iter, r)
		}
	}
}

// TestBatchCompleteExactKeys: keys, scopes and operations that differ only
// by case, trailing spaces or NULs, or in ways a collation ignores (ß/ss,
// composed/decomposed accents, full-width letters, the Ångström sign, a
// latin1 byte) are different records. All are reserved under one token, so
// that only the key tells them apart; completing half of them must complete
// exactly those, each with its own answer, and leave their siblings
// pending, whatever the session's character set and collation and whether
// the driver interpolates the arguments.
func TestBatchCompleteExactKeys(t *testing.T) {
	t.Parallel()
	names := []string{"a", "A", "a ", "a  ", "a\x00", " a", "a\t", "ss", "ß", "SS", "\u00e9", "e\u0301", "\u00c5", "\u212b",
		"\uff41", "\xe9", "\xc3\xa9 ", "\xff"}
	for _, v := range dsnVariants {
		for _, stale := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stale=%v", v.name, stale), func(t *testing.T) {
				t.Parallel()
				s, db := newStoreDSN(t, v.dsn)
				ctx := t.Context()
				var keys []idemstore.Key
				for _, name := range names {
					keys = append(keys,
						idemstore.Key{Scope: "tenant", Operation: "POST /x", Key: name},
						idemstore.Key{Scope: "tenant" + name, Operation: "POST /x", Key: "k"},
						idemstore.Key{Scope: "tenant", Operation: "POST /x" + name, Key: "k"})
				}
				for _, k := range keys {
					seed(t, s, k, "same")
				}
				body := func(i int) []byte { return fmt.Appendf(nil, "answer %d", i) }
				for half := range 2 {
					var (
						calls []func() batchtest.Result
						mine  []int
					)
					for i, k := range keys {
						if i%2 == half {
							calls = append(calls, completeWith(ctx, s, k, "same", &idemstore.Response{Status: 200, Body: body(i)}, time.Duration(i+1)*time.Second))
							mine = append(mine, i)
						}
					}
					if stale {
						calls = append(calls, batchtest.Complete(ctx, s, batchtest.Key("absent"), "same", time.Hour))
					}
					got := batchtest.InOneBatch(t, s.Batcher(), calls...)
					for j, i := range mine {
						if got[j].Err != nil {
							t.Errorf("Complete %q/%q/%q: %v", keys[i].Scope, keys[i].Operation, keys[i].Key, got[j].Err)
						}
					}
					for i, k := range keys {
						r := readStored(t, db, k)
						switch {
						case i%2 > half:
							if r.state != "pending" || r.response != nil {
								t.Errorf("%q/%q/%q, not completed yet: %s %q", k.Scope, k.Operation, k.Key, r.state, r.response)
							}
						default:
							resp, err := idemstore.DecodeResponse(r.response)
							if r.state != "completed" || err != nil || !bytes.Equal(resp.Body, body(i)) || r.retention.Int64 != int64(i+1)*1000 {
								t.Errorf("%q/%q/%q: %s, %+v (%v), retention %v; want completed with %q, %ds",
									k.Scope, k.Operation, k.Key, r.state, resp, err, r.retention, body(i), i+1)
							}
						}
					}
				}
			})
		}
	}
}

// TestBatchCompleteLargestBatch: a full chunk (256 calls) whose scopes,
// operations, keys and tokens are as long as the columns allow, with bytes
// that sort differently in any collation than byte for byte, and
// retentions from negative to centuries: the derived table is as wide and
// long as it gets, and each record must still get its own answer and
// retention.
func TestBatchCompleteLargestBatch(t *testing.T) {
	t.Parallel()
	for _, stale := range []bool{false, true} {
		t.Run(fmt.Sprintf("stale=%v", stale), func(t *testing.T) {
			t.Parallel()
			s, db := newStore(t, "")
			ctx := t.Context()
			const n = 256
			retentions := []time.Duration{0, time.Millisecond, -time.Millisecond, -time.Hour, 500 * time.Microsecond,
				-999 * time.Microsecond, 10 * 365 * 24 * time.Hour, time.Duration(math.MaxInt64), time.Duration(math.MinInt64) + 1}
			long := func(n int, fill byte, tail string) string {
				return strings.Repeat(string([]byte{fill}), n-len(tail)) + tail
			}
			var (
				keys  []idemstore.Key
				toks  []string
				calls []func() batchtest.Result
			)
			for i := range n {
				b := byte(255 - i) // high bytes first: byte order is not the order the calls came in
				k := idemstore.Key{
					Scope:     long(idemmysql.MaxScopeLen, 's', fmt.Sprintf("%c%03d", b, i%7)),
					Operation: long(idemmysql.MaxOperationLen, 'o', fmt.Sprintf("%03d", i%3)),
					Key:       long(idemmysql.MaxKeyLen, b, fmt.Sprintf("%03d", i)),
				}
				tok := long(idemmysql.MaxTokenLen, 't', fmt.Sprintf("%03d", i))
				seed(t, s, k, tok)
				keys, toks = append(keys, k), append(toks, tok)
				calls = append(calls, completeWith(ctx, s, k, tok, &idemstore.Response{Status: 200 + i%100, Body: []byte(tok[len(tok)-3:])}, retentions[i%len(retentions)]))
			}
			if stale {
				calls = append(calls, batchtest.Complete(ctx, s, keys[n/2], "nobody's", time.Hour))
			}
			got := batchtest.InOneBatch(t, s.Batcher(), calls...)
			for i, k := range keys {
				if got[i].Err != nil {
					t.Errorf("Complete %d: %v", i, got[i].Err)
					continue
				}
				r := readStored(t, db, k)
				resp, err := idemstore.DecodeResponse(r.response)
				want := retentions[i%len(retentions)].Milliseconds()
				if r.state != "completed" || err != nil || resp.Status != 200+i%100 || string(resp.Body) != toks[i][len(toks[i])-3:] || !r.retention.Valid || r.retention.Int64 != want {
					t.Errorf("record %d: %s, %+v (%v), retention %v; want completed, %d, retention %dms", i, r.state, resp, err, r.retention, 200+i%100, want)
				}
			}
			if stale && !errors.Is(got[n].Err, idemstore.ErrLeaseLost) {
				t.Errorf("stale Complete: %v, want ErrLeaseLost", got[n].Err)
			}
		})
	}
}

// TestBatchCompleteBodies: answers picked by position come back byte for
// byte: empty bodies, bodies of every byte value, bodies as large as a
// batch takes (several statements' worth), headers and NotReplayable, in
// every DSN variant.
func TestBatchCompleteBodies(t *testing.T) {
	t.Parallel()
	every := make([]byte, 0, 512)
	for i := range 512 {
		every = append(every, byte(i))
	}
	big := bytes.Repeat(every, (256<<10)/len(every)) // maxBatchedValue
	responses := []*idemstore.Response{
		{Status: 200},
		{Status: 204, Body: []byte{}},
		{Status: 200, Body: every},
		{Status: 201, Body: big},
		{Status: 500, Body: []byte("'\\\"\x00\x1a"), Header: map[string][]string{"X-A": {"1", "\xff"}}},
		{Status: 202, Body: append([]byte{0xff}, big[1:]...)},
		{Status: 200, NotReplayable: "too large"},
		{Status: 203, Body: []byte("   ")},
		{Status: 200, Body: big[:len(big)-1]},
		{Status: 200, Body: bytes.Repeat([]byte{0}, 1000)},
	}
	for _, v := range dsnVariants {
		for _, stale := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stale=%v", v.name, stale), func(t *testing.T) {
				t.Parallel()
				s, db := newStoreDSN(t, v.dsn)
				ctx := t.Context()
				var (
					keys  []idemstore.Key
					calls []func() batchtest.Result
				)
				for i, resp := range responses {
					k := batchtest.Key(fmt.Sprintf("body-%d", i))
					seed(t, s, k, "t")
					keys = append(keys, k)
					calls = append(calls, completeWith(ctx, s, k, "t", resp, time.Hour))
				}
				if stale {
					calls = append(calls, batchtest.Complete(ctx, s, keys[0], "nobody's", time.Hour))
				}
				got := batchtest.InOneBatch(t, s.Batcher(), calls...)
				for i, want := range responses {
					if got[i].Err != nil {
						t.Errorf("Complete %d: %v", i, got[i].Err)
						continue
					}
					r := readStored(t, db, keys[i])
					if r.state != "completed" || !bytes.Equal(r.response, idemstore.EncodeResponse(want)) {
						t.Errorf("answer %d: %s, %d bytes; want completed with the %d bytes encoded", i, r.state, len(r.response), len(idemstore.EncodeResponse(want)))
					}
				}
				if stale && !errors.Is(got[len(responses)].Err, idemstore.ErrLeaseLost) {
					t.Errorf("stale Complete: %v, want ErrLeaseLost", got[len(responses)].Err)
				}
			})
		}
	}
}

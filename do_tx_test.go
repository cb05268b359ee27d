package idem_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// txBackend is a SQL store whose database also holds the business table
// (ledger) that DoTx's fn writes to.
type txBackend[Tx any] struct {
	engine *idem.Engine
	inTx   idem.TxFunc[Tx]
	// insert adds a ledger row in tx.
	insert func(ctx context.Context, tx Tx) error
	// rows counts the committed ledger rows.
	rows func(t *testing.T) int
}

func sqliteTxBackend(t *testing.T) txBackend[*sql.Tx] {
	db, store, cleanup := openSQLite()
	t.Cleanup(cleanup)
	if _, err := db.Exec(`CREATE TABLE ledger (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	e, err := idem.NewEngine(store, quiet(idem.EngineConfig{}))
	if err != nil {
		t.Fatal(err)
	}
	return txBackend[*sql.Tx]{
		engine: e,
		inTx:   idem.SQLTx(db, nil),
		insert: func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO ledger (amount) VALUES (500)`)
			return err
		},
		rows: func(t *testing.T) int {
			var n int
			if err := db.QueryRow(`SELECT count(*) FROM ledger`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
	}
}

// pgTxBackend returns a backend on a fresh schema of pool's database.
func pgTxBackend(t *testing.T, pool *pgxpool.Pool) txBackend[pgx.Tx] {
	ctx := context.Background()
	var b [6]byte
	rand.Read(b[:])
	schema := "idem_dotx_" + hex.EncodeToString(b[:])
	ident := pgx.Identifier{schema}.Sanitize()
	if err := idempg.Migrate(ctx, pool, idempg.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA "+ident+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	if _, err := pool.Exec(ctx, `CREATE TABLE `+ident+`.ledger (id bigserial PRIMARY KEY, amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	store, err := idempg.New(pool, idempg.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	e, err := idem.NewEngine(store, quiet(idem.EngineConfig{}))
	if err != nil {
		t.Fatal(err)
	}
	return txBackend[pgx.Tx]{
		engine: e,
		inTx: func(ctx context.Context, f func(pgx.Tx) error) error {
			return pgx.BeginFunc(ctx, pool, f)
		},
		insert: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+ident+`.ledger (amount) VALUES (500)`)
			return err
		},
		rows: func(t *testing.T) int {
			var n int
			if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+ident+`.ledger`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
	}
}

func TestDoTxSQLite(t *testing.T) {
	t.Parallel()
	testDoTx(t, sqliteTxBackend)
}

func TestDoTxPostgres(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), testenv.Getenv(t, "IDEM_TEST_POSTGRES_URL"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // after the parallel subtests
	testDoTx(t, func(t *testing.T) txBackend[pgx.Tx] { return pgTxBackend(t, pool) })
}

// errFailedCommit stands for a commit that failed (a serialization
// failure): the transaction rolled back.
var errFailedCommit = errors.New("could not serialize access due to concurrent update")

func testDoTx[Tx any](t *testing.T, open func(t *testing.T) txBackend[Tx]) {
	boom := errors.New("ledger service said no")
	txReq := func(kind idem.Kind) idem.Request {
		return idem.Request{Key: idem.Key{Scope: "tenant-1", Operation: "payout", Key: "po_1"}, Fingerprint: "v1:po_1", Kind: kind}
	}
	// run calls DoTx with an fn that inserts a ledger row and then does
	// what then says.
	run := func(ctx context.Context, b txBackend[Tx], r idem.Request, inTx idem.TxFunc[Tx], then func(ctx context.Context) error) (receipt, error) {
		return idem.DoTx(ctx, b.engine, r, inTx, func(ctx context.Context, tx Tx) (receipt, error) {
			if idem.LeaseFrom(ctx) == nil {
				t.Error("fn's context carries no lease")
			}
			if err := b.insert(ctx, tx); err != nil {
				return receipt{}, err
			}
			if then != nil {
				if err := then(ctx); err != nil {
					return receipt{}, err
				}
			}
			return receipt{ID: "po_1", Amount: 500}, nil
		})
	}
	// failedCommit runs f in a transaction of b that then fails to commit:
	// what f did rolls back, and it returns errFailedCommit.
	failedCommit := func(ctx context.Context, b txBackend[Tx], f func(Tx) error) error {
		return b.inTx(ctx, func(tx Tx) error {
			if err := f(tx); err != nil {
				return err
			}
			return errFailedCommit
		})
	}
	// retry runs the job again, successfully unless the key says otherwise.
	retry := func(t *testing.T, b txBackend[Tx], r idem.Request) (receipt, error) {
		return run(context.Background(), b, r, b.inTx, nil)
	}

	t.Run("commits once and replays", func(t *testing.T) {
		t.Parallel()
		b := open(t)
		var runs atomic.Int32
		count := func(context.Context) error { runs.Add(1); return nil }
		for range 2 {
			v, err := run(context.Background(), b, txReq(idem.Transactional), b.inTx, count)
			if err != nil || v.ID != "po_1" || v.Amount != 500 {
				t.Fatalf("DoTx = %+v, %v", v, err)
			}
		}
		if runs.Load() != 1 || b.rows(t) != 1 {
			t.Fatalf("runs %d, ledger rows %d", runs.Load(), b.rows(t))
		}
	})

	t.Run("concurrent calls commit once", func(t *testing.T) {
		t.Parallel()
		b := open(t)
		r := txReq(idem.Transactional)
		r.Wait = time.Minute
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				if v, err := run(context.Background(), b, r, b.inTx, nil); err != nil || v.ID != "po_1" {
					t.Errorf("DoTx = %+v, %v", v, err)
				}
			})
		}
		wg.Wait()
		if n := b.rows(t); n != 1 {
			t.Fatalf("ledger rows %d", n)
		}
	})

	// A failure rolls the row back; what becomes of the key is the same as
	// for Do.
	for _, tc := range []struct {
		name     string
		kind     idem.Kind
		then     func(ctx context.Context) error
		released bool
	}{
		{"error transactional", idem.Transactional, func(context.Context) error { return boom }, true},
		{"error external", idem.External, func(context.Context) error { return boom }, false},
		{"retryable external", idem.External, func(context.Context) error { return idem.Retryable(boom) }, true},
		{"ambiguous transactional", idem.Transactional, func(context.Context) error { return idem.Ambiguous(boom) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := open(t)
			if _, err := run(context.Background(), b, txReq(tc.kind), b.inTx, tc.then); !errors.Is(err, boom) {
				t.Fatalf("DoTx = %v, want fn's error", err)
			}
			if n := b.rows(t); n != 0 {
				t.Fatalf("a failed job left %d ledger rows", n)
			}
			_, err := retry(t, b, txReq(tc.kind))
			switch {
			case tc.released && (err != nil || b.rows(t) != 1):
				t.Fatalf("retry after a release: %v, rows %d", err, b.rows(t))
			case !tc.released && (!errors.Is(err, idem.ErrNeedsReview) || b.rows(t) != 0):
				t.Fatalf("retry after an escalation: %v, rows %d", err, b.rows(t))
			}
		})
	}

	// The worker is stopped mid-job: the context is cancelled after the row
	// was inserted, the transaction rolls back, and the key is released.
	t.Run("cancelled mid-job", func(t *testing.T) {
		t.Parallel()
		b := open(t)
		ctx, cancel := context.WithCancel(context.Background())
		_, err := run(ctx, b, txReq(idem.Transactional), b.inTx, func(ctx context.Context) error {
			cancel()
			<-ctx.Done()
			return ctx.Err()
		})
		if !errors.Is(err, context.Canceled) || b.rows(t) != 0 {
			t.Fatalf("DoTx = %v, rows %d", err, b.rows(t))
		}
		if _, err := retry(t, b, txReq(idem.Transactional)); err != nil || b.rows(t) != 1 {
			t.Fatalf("retry: %v, rows %d", err, b.rows(t))
		}
	})

	t.Run("panic mid-job", func(t *testing.T) {
		t.Parallel()
		b := open(t)
		func() {
			defer func() {
				if p := recover(); p != "boom" {
					t.Fatalf("recovered %v", p)
				}
			}()
			run(context.Background(), b, txReq(idem.Transactional), b.inTx, func(context.Context) error { panic("boom") })
		}()
		if _, err := retry(t, b, txReq(idem.Transactional)); err != nil || b.rows(t) != 1 {
			t.Fatalf("retry: %v, rows %d", err, b.rows(t))
		}
	})

	// The commit went through but its acknowledgement was lost: what the
	// store shows decides, and the job succeeded.
	t.Run("commit acknowledgement lost", func(t *testing.T) {
		t.Parallel()
		b := open(t)
		lost := func(ctx context.Context, f func(Tx) error) error {
			if err := b.inTx(ctx, f); err != nil {
				return err
			}
			return errors.New("read tcp: connection reset by peer")
		}
		v, err := run(context.Background(), b, txReq(idem.Transactional), lost, nil)
		if err != nil || v.ID != "po_1" {
			t.Fatalf("DoTx = %+v, %v", v, err)
		}
		if v, err := retry(t, b, txReq(idem.Transactional)); err != nil || v.ID != "po_1" || b.rows(t) != 1 {
			t.Fatalf("replay: %+v, %v, rows %d", v, err, b.rows(t))
		}
	})

	// The commit failed: nothing was stored, and the key is released.
	t.Run("commit failed", func(t *testing.T) {
		t.Parallel()
		b := open(t)
		failed := func(ctx context.Context, f func(Tx) error) error { return failedCommit(ctx, b, f) }
		if _, err := run(context.Background(), b, txReq(idem.Transactional), failed, nil); err == nil || b.rows(t) != 0 {
			t.Fatalf("DoTx = %v, rows %d", err, b.rows(t))
		}
		if _, err := retry(t, b, txReq(idem.Transactional)); err != nil || b.rows(t) != 1 {
			t.Fatalf("retry: %v, rows %d", err, b.rows(t))
		}
	})

	// A TxFunc that retries serialization failures runs fn again in a
	// fresh transaction: the first try's completion rolled back with it,
	// the second one's commits.
	t.Run("retried transaction", func(t *testing.T) {
		t.Parallel()
		b := open(t)
		retrying := func(ctx context.Context, f func(Tx) error) error {
			if err := failedCommit(ctx, b, f); !errors.Is(err, errFailedCommit) {
				return err
			}
			return b.inTx(ctx, f)
		}
		var runs atomic.Int32
		count := func(context.Context) error { runs.Add(1); return nil }
		if v, err := run(context.Background(), b, txReq(idem.Transactional), retrying, count); err != nil || v.ID != "po_1" {
			t.Fatalf("DoTx = %+v, %v", v, err)
		}
		if v, err := retry(t, b, txReq(idem.Transactional)); err != nil || v.ID != "po_1" || runs.Load() != 2 || b.rows(t) != 1 {
			t.Fatalf("replay %+v, %v; runs %d, rows %d", v, err, runs.Load(), b.rows(t))
		}
	})

	// The lease is lost before the transaction completes it (recovery
	// released it, or another worker took it over): the completion is
	// fenced out, the row rolls back, and DoTx says so.
	t.Run("lease lost", func(t *testing.T) {
		t.Parallel()
		b := open(t)
		var stolen bool
		steal := func(ctx context.Context, f func(Tx) error) error {
			rec, err := b.engine.Get(ctx, txReq(idem.Transactional).Key)
			if err != nil {
				return err
			}
			if err := b.engine.Store().Release(ctx, idemstore.ReleaseParams{Key: rec.Key, Token: rec.Token}); err != nil {
				return err
			}
			stolen = true
			return b.inTx(ctx, f)
		}
		_, err := run(context.Background(), b, txReq(idem.Transactional), steal, nil)
		if !stolen || !errors.Is(err, idem.ErrLeaseLost) || b.rows(t) != 0 {
			t.Fatalf("DoTx = %v, rows %d", err, b.rows(t))
		}
	})

	t.Run("holder died", func(t *testing.T) {
		t.Parallel()
		b := open(t)
		dead := txReq(idem.Transactional)
		dead.Lease = time.Millisecond
		if res, err := b.engine.Begin(context.Background(), dead); err != nil || res.Outcome != idem.Acquired {
			t.Fatalf("Begin = %v, %v", res.Outcome, err)
		}
		r := txReq(idem.Transactional)
		r.Wait = time.Minute
		if _, err := run(context.Background(), b, r, b.inTx, nil); err != nil || b.rows(t) != 1 {
			t.Fatalf("takeover: %v, rows %d", err, b.rows(t))
		}
	})
}

// DoTx needs a store that completes in the caller's transaction type.
func TestDoTxRefusesAStoreWithoutCompleteTx(t *testing.T) {
	t.Parallel()
	e, _ := newEngine(t, quiet(idem.EngineConfig{}))
	db, _, cleanup := openSQLite()
	defer cleanup()
	_, err := idem.DoTx(context.Background(), e, jobReq("k", idem.Transactional), idem.SQLTx(db, nil), func(context.Context, *sql.Tx) (int, error) {
		t.Error("fn ran")
		return 0, nil
	})
	if err == nil || fmt.Sprint(err) == "" {
		t.Fatal("DoTx over the memory store did not fail")
	}
	if _, err := e.Get(context.Background(), jobReq("k", idem.Transactional).Key); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("a refused DoTx reserved the key: %v", err)
	}
	if _, err := idem.DoTx[int, *sql.Tx](context.Background(), e, jobReq("k", idem.Transactional), nil, nil); err == nil {
		t.Fatal("DoTx without functions did not fail")
	}
}

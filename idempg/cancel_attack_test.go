package idempg_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/groupcommit/batchtest"
)

// These tests end a claim's context while its statement waits for a lock
// on the key (see batchtest.CancelledReserve and the checks beside it).
//
// pgx, when a context ends mid-statement, closes the connection and sends
// the server a cancel request from a goroutine of its own: whether that
// request lands before the lock comes free is a race, which a lost cancel
// request (a load balancer that sends it to another pooler, a firewall)
// always loses. The tests lose it on purpose (cancelLostPool), so that the
// server always finishes the abandoned statement.

// cancelLostPool returns a pool of its own, closed when the test ends,
// whose cancel requests never reach the server.
func cancelLostPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &cancelLoser{Conn: c}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// cancelLoser is a connection that swallows a CancelRequest sent as its
// first message, and then reads as closed.
type cancelLoser struct {
	net.Conn
	started, lost atomic.Bool
}

// cancelRequestCode is the code that follows a CancelRequest's length.
const cancelRequestCode = 80877102

func (c *cancelLoser) Write(b []byte) (int, error) {
	if !c.started.Swap(true) && len(b) >= 8 && binary.BigEndian.Uint32(b[4:8]) == cancelRequestCode {
		c.lost.Store(true)
	}
	if c.lost.Load() {
		return len(b), nil
	}
	return c.Conn.Write(b)
}

func (c *cancelLoser) Read(b []byte) (int, error) {
	if c.lost.Load() {
		return 0, io.EOF
	}
	return c.Conn.Read(b)
}

// hold is a batchtest.Hold: a transaction of its own on pool, on backend
// pid; waiter is the backend that waits for it, once Waiter has seen it.
type hold struct {
	pool        *pgxpool.Pool
	tx          pgx.Tx
	pid, waiter uint32
}

// holdKey returns a batchtest.Holder that inserts the key's record in a
// transaction that stays open: an insert of the key waits for it, a
// release does not (it cannot see the row).
func holdKey(pool *pgxpool.Pool, schema string) batchtest.Holder {
	return func(t testing.TB, k idemstore.Key) batchtest.Hold {
		return newHold(t, pool, "INSERT INTO "+pgx.Identifier{schema, "idem_records"}.Sanitize()+
			` (scope, operation, key, fingerprint, state, token, lease_until, created_at, updated_at)
			VALUES ($1, $2, $3, 'fp-hold', 'pending', 'hold', now() + interval '1 hour', now(), now())
			RETURNING pg_backend_pid()`, k)
	}
}

// holdRow returns a batchtest.Holder that locks the key's record FOR SHARE
// in a transaction that stays open: any change of the record waits.
func holdRow(pool *pgxpool.Pool, schema string) batchtest.Holder {
	return func(t testing.TB, k idemstore.Key) batchtest.Hold {
		return newHold(t, pool, "SELECT pg_backend_pid() FROM "+pgx.Identifier{schema, "idem_records"}.Sanitize()+
			" WHERE scope = $1 AND operation = $2 AND key = $3 FOR SHARE", k)
	}
}

// newHold runs query, which takes the hold on k and returns the backend's
// pid, in a transaction that stays open.
func newHold(t testing.TB, pool *pgxpool.Pool, query string, k idemstore.Key) *hold {
	t.Helper()
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	h := &hold{pool: pool, tx: tx}
	if err := tx.QueryRow(t.Context(), query, k.Scope, k.Operation, k.Key).Scan(&h.pid); err != nil {
		t.Fatal(err)
	}
	return h
}

// poll runs check every few milliseconds until it reports true.
func poll(t testing.TB, what string, check func() bool) {
	t.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !check() {
		select {
		case <-tick.C:
		case <-t.Context().Done():
			t.Fatal(what)
		}
	}
}

func (h *hold) Waiter(t testing.TB) {
	t.Helper()
	poll(t, "nothing waited for the hold", func() bool {
		err := h.pool.QueryRow(t.Context(), "SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)) LIMIT 1", h.pid).Scan(&h.waiter)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		return err == nil
	})
}

func (h *hold) Unblock(t testing.TB) {
	t.Helper()
	if err := h.tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// Settled: the waiter's backend is gone, or idle outside a transaction.
func (h *hold) Settled(t testing.TB) {
	t.Helper()
	poll(t, "the waiter still runs what its client abandoned", func() bool {
		var busy bool
		err := h.pool.QueryRow(t.Context(), "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND state IS DISTINCT FROM 'idle')", h.waiter).Scan(&busy)
		if err != nil {
			t.Fatal(err)
		}
		return !busy
	})
}

func (h *hold) Kill(t testing.TB) {
	t.Helper()
	var done bool
	if err := h.pool.QueryRow(t.Context(), "SELECT pg_terminate_backend($1)", h.waiter).Scan(&done); err != nil || !done {
		t.Fatalf("pg_terminate_backend(%d): %v, %v", h.waiter, done, err)
	}
}

var cancelModes = []struct {
	name string
	cfg  idempg.Config
}{
	{"batch=on", idempg.Config{}}, // a lone call runs alone at once
	{"batch=off", idempg.Config{DisableBatch: true}},
}

func TestCancelledLoneReserveLandsNoOrphan(t *testing.T) {
	t.Parallel()
	for _, mode := range cancelModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			pool := cancelLostPool(t)
			s, schema := newStoreIn(t, pool, mode.cfg)
			batchtest.CancelledReserve(t, s, holdKey(pool, schema))
		})
	}
}

func TestCancelledLoneBeginLandsNoOrphan(t *testing.T) {
	t.Parallel()
	for _, mode := range cancelModes {
		for _, kind := range []idem.Kind{idem.External, idem.Transactional} {
			t.Run(mode.name+"/"+kind.String(), func(t *testing.T) {
				t.Parallel()
				pool := cancelLostPool(t)
				s, schema := newStoreIn(t, pool, mode.cfg)
				batchtest.CancelledBegin(t, s, kind, holdKey(pool, schema))
			})
		}
	}
}

func TestCancelledBatchLandsNoOrphan(t *testing.T) {
	t.Parallel()
	pool := cancelLostPool(t)
	s, schema := newStoreIn(t, pool, idempg.Config{})
	batchtest.CancelledBatch(t, s, s.Batcher(), holdKey(pool, schema))
}

func TestCancelledBatchedBeginLandsNoOrphan(t *testing.T) {
	t.Parallel()
	pool := cancelLostPool(t)
	s, schema := newStoreIn(t, pool, idempg.Config{})
	batchtest.CancelledBatchedBegin(t, s, s.Batcher(), holdRow(pool, schema))
}

func TestCancelledTakeoverLandsNothing(t *testing.T) {
	t.Parallel()
	pool := cancelLostPool(t)
	s, schema := newStoreIn(t, pool, idempg.Config{})
	batchtest.CancelledTakeover(t, s, holdRow(pool, schema))
}

// TestLoneReserveBackendTerminated: pg_terminate_backend on the backend of
// a lone Reserve that waits.
func TestLoneReserveBackendTerminated(t *testing.T) {
	t.Parallel()
	pool := cancelLostPool(t)
	s, schema := newStoreIn(t, pool, idempg.Config{})
	batchtest.KilledBegin(t, s, holdKey(pool, schema))
}

// TestLoneReserveLostCommitReply: the reply to a lone Reserve's COMMIT is
// lost. The pool keeps a second connection open, so that the release does
// not wait for a new one (the engine bounds it to a fraction of a second).
func TestLoneReserveLostCommitReply(t *testing.T) {
	t.Parallel()
	pool, proxy := proxiedPool(t)
	cfg := pool.Config()
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var conns []*pgxpool.Conn
	for range 2 {
		c, err := pool.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	s, err := idempg.New(pool, idempg.Config{Schema: newSchema(t, pool)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	batchtest.LostCommitReply(t, s, func() func() bool {
		proxy.DropNextCommit()
		return func() bool { return !proxy.Armed() }
	})
}

// leaveAfterInsert is a pgx tracer that runs leave once the server has
// answered a batch's INSERT: the caller leaves between the insert and its
// COMMIT.
type leaveAfterInsert struct{ leave func() }

func (leaveAfterInsert) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (leaveAfterInsert) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (leaveAfterInsert) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (l leaveAfterInsert) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	if data.Err == nil && strings.HasPrefix(data.SQL, "INSERT") {
		l.leave()
	}
}
func (leaveAfterInsert) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestLoneReserveLeftBeforeCommit: a lone Reserve's caller leaves after the
// insert answered and before COMMIT was sent. Nothing commits: the caller,
// told its Reserve failed, owns nothing.
func TestLoneReserveLeftBeforeCommit(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cfg, err := pgxpool.ParseConfig(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = leaveAfterInsert{leave: cancel}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newStore(t, pool, idempg.Config{DisableBatch: true})
	k := batchtest.Key("left")
	if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: "left", Lease: time.Hour}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Reserve whose caller left before its COMMIT: %v, want context.Canceled", err)
	}
	if rec, err := s.Get(t.Context(), k); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("after the Reserve whose caller left: %+v, %v; want no record", rec, err)
	}
}

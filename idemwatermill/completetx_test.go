package idemwatermill_test

import (
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemwatermill"
)

func sqliteEngine(t *testing.T) (*sql.DB, *idemsqlite.Store, *idem.Engine) {
	t.Helper()
	return sqliteEngineWith(t, idem.EngineConfig{})
}

func sqliteEngineWith(t *testing.T, cfg idem.EngineConfig) (*sql.DB, *idemsqlite.Store, *idem.Engine) {
	t.Helper()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"), idemsqlite.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store, err := idemsqlite.New(db, idemsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = discard
	e, err := idem.NewEngine(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return db, store, e
}

// A handler that stored one set of messages with CompleteTx and returned
// another: what committed is emitted, now and on every redelivery. A
// handler whose transaction rolled back after CompleteTx has its
// Transactional key released, and the redelivery runs it again.
func TestCompleteTxWhatCommittedIsEmitted(t *testing.T) {
	t.Parallel()
	db, store, e := sqliteEngine(t)
	var runs int
	h := protect(t, e, idemwatermill.Config{Scope: "billing", Kind: idem.Transactional}, func(msg *message.Message) ([]*message.Message, error) {
		runs++
		ctx := msg.Context()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback()
		if err := idemwatermill.CompleteTx[*sql.Tx](ctx, store, tx, message.NewMessage("stored", []byte("a"))); err != nil {
			return nil, err
		}
		if runs == 1 {
			return nil, errors.New("rolled back") // the deferred rollback undoes CompleteTx
		}
		return []*message.Message{message.NewMessage("returned", []byte("b"))}, tx.Commit()
	})
	if _, err := h(delivery("m-1", "x")); err == nil || idemwatermill.IsPoison(err) {
		t.Fatalf("rolled back: %v; want the error, not poison", err)
	}
	for i := range 2 {
		out, err := h(delivery("m-1", "x"))
		if err != nil || len(out) != 1 || out[0].UUID != "stored" {
			t.Fatalf("delivery %d: %v, %v; want the stored message", i+2, out, err)
		}
	}
	if runs != 2 {
		t.Fatalf("%d runs", runs)
	}
}

// CompleteTx outside the middleware has no lease to complete.
func TestCompleteTxWithoutLease(t *testing.T) {
	t.Parallel()
	db, store, _ := sqliteEngine(t)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := idemwatermill.CompleteTx[*sql.Tx](t.Context(), store, tx); !errors.Is(err, idemwatermill.ErrNoLease) {
		t.Fatalf("%v", err)
	}
}

// Produced messages too large to keep (over the engine's MaxResponseBody),
// stored with CompleteTx: the key completes as not replayable, and the
// delivery that ran the handler emits what it returned, since nothing else
// has them; a redelivery is poison, and runs nothing.
func TestCompleteTxOverTheLimitEmitsWhatItReturned(t *testing.T) {
	t.Parallel()
	db, store, e := sqliteEngineWith(t, idem.EngineConfig{MaxResponseBody: 64})
	var runs int
	h := protect(t, e, idemwatermill.Config{Scope: "billing", Kind: idem.Transactional}, func(msg *message.Message) ([]*message.Message, error) {
		runs++
		ctx := msg.Context()
		receipt := message.NewMessage("receipt-1", []byte(strings.Repeat("r", 100)))
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback()
		if err := idemwatermill.CompleteTx[*sql.Tx](ctx, store, tx, receipt); err != nil {
			return nil, err
		}
		return []*message.Message{receipt}, tx.Commit()
	})
	out, err := h(delivery("m-1", "x"))
	if err != nil || len(out) != 1 || out[0].UUID != "receipt-1" {
		t.Fatalf("the delivery that ran: %v, %v; want the receipt it returned", out, err)
	}
	if _, err := h(delivery("m-1", "x")); !errors.Is(err, idem.ErrNotReplayable) || !idemwatermill.IsPoison(err) || runs != 1 {
		t.Fatalf("redelivery: %v after %d runs; want not replayable, poison, one run", err, runs)
	}
}

// A handler whose commit succeeded but reported an error (its
// acknowledgement lost), retried by Watermill's Retry inside the
// middleware: the retry stores another receipt with CompleteTx, which
// cannot commit. What the delivery emits is the receipt that committed,
// the one every redelivery emits, under the same UUID.
func TestCompleteTxRetriedAfterCommitEmitsWhatCommitted(t *testing.T) {
	t.Parallel()
	db, store, e := sqliteEngine(t)
	attempt := 0
	h := func(msg *message.Message) ([]*message.Message, error) {
		attempt++
		ctx := msg.Context()
		receipt := message.NewMessage(fmt.Sprintf("receipt-%d", attempt), []byte("paid"))
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback()
		if err := idemwatermill.CompleteTx[*sql.Tx](ctx, store, tx, receipt); err != nil {
			return nil, err
		}
		if err := tx.Commit(); err != nil {
			return nil, err
		}
		if attempt == 1 {
			return nil, errors.New("connection reset after COMMIT")
		}
		return []*message.Message{receipt}, nil
	}
	retry := middleware.Retry{MaxRetries: 2}.Middleware
	protected := protect(t, e, idemwatermill.Config{Scope: "billing", Kind: idem.Transactional}, retry(h))
	first, err := protected(delivery("m-1", "x"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := protected(delivery("m-1", "x"))
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 1 || len(again) != 1 || first[0].UUID != "receipt-1" || again[0].UUID != "receipt-1" {
		t.Fatalf("emitted %v, then on redelivery %v; want receipt-1 both times", first, again)
	}
}

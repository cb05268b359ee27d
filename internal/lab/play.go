package lab

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"time"
)

// driverErrBadConn, returned from sql.Conn.Raw, makes database/sql close
// the connection instead of pooling it.
var driverErrBadConn = driver.ErrBadConn

// outcome is how one worker's attempt at one key ended.
type outcome struct {
	// won: the worker's transaction committed with its row in it, so it
	// believes it is the one to run the operation, and does.
	won            bool
	err            error
	class          errClass
	barrierTimeout bool
}

// endTimeout bounds a ROLLBACK, which runs also after the context that
// the statement it ends ran under was cancelled.
const endTimeout = 5 * time.Second

// play is one worker's attempt at key with strategy s at level lvl. The
// worker waits at b (nil: no barrier) between its check and its insert,
// calling onArrive (when not nil) first.
func (r *run) play(ctx context.Context, w *worker, s Strategy, lvl Isolation, table, key string, b *barrier, onArrive func()) (o outcome) {
	arrived := b == nil
	arrive := func() error {
		if arrived {
			return nil
		}
		arrived = true
		if onArrive != nil {
			onArrive()
		}
		ok, err := b.arrive(ctx)
		o.barrierTimeout = !ok && err == nil
		return err
	}
	// Every worker arrives once, also after a failure, so that none holds
	// the others; a failed worker arrives after its rollback.
	defer arrive()
	fail := func(err error) outcome {
		w.rollback(ctx)
		arrive()
		return outcome{err: err, class: r.d.classify(err), barrierTimeout: o.barrierTimeout}
	}

	if w.open { // a rollback failed earlier: try again before going on
		if err := w.rollback(ctx); err != nil {
			return outcome{err: err, class: classOther}
		}
	}
	w.open = true
	for _, stmt := range r.d.begin(lvl, s) {
		if _, err := w.conn.ExecContext(ctx, stmt); err != nil {
			return fail(err)
		}
	}

	if s == InsertFirst {
		if err := arrive(); err != nil {
			return fail(err)
		}
		res, err := w.conn.ExecContext(ctx, r.d.insertFirst(table), key, w.n)
		if err != nil {
			if r.d.loserOnDuplicate && r.d.classify(err) == classUnique {
				// The duplicate-key error is how this loser learns that
				// another worker holds the key: handled, not surfaced.
				w.rollback(ctx)
				return outcome{}
			}
			return fail(err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fail(err)
		}
		if err := w.commit(ctx); err != nil {
			return fail(err)
		}
		return outcome{won: n == 1, barrierTimeout: o.barrierTimeout}
	}

	check := r.d.check(table)
	if s == SelectForUpdate {
		check += r.d.forUpdate
	}
	var one int
	err := w.conn.QueryRowContext(ctx, check, key).Scan(&one)
	found := err == nil
	if errors.Is(err, sql.ErrNoRows) {
		err = nil
	}
	if err != nil {
		return fail(err)
	}
	if err := arrive(); err != nil {
		return fail(err)
	}
	if !found {
		if _, err := w.conn.ExecContext(ctx, r.d.insert(table), key, w.n); err != nil {
			return fail(err)
		}
	}
	if err := w.commit(ctx); err != nil {
		return fail(err)
	}
	return outcome{won: !found, barrierTimeout: o.barrierTimeout}
}

func (w *worker) commit(ctx context.Context) error {
	if _, err := w.conn.ExecContext(ctx, "COMMIT"); err != nil {
		return err
	}
	w.open = false
	return nil
}

// rollback ends the worker's transaction, if any, even when ctx is done.
func (w *worker) rollback(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	if _, err := w.conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		return err
	}
	w.open = false
	return nil
}

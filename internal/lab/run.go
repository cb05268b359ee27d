package lab

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/internal/storeurl"
)

// Report is what a run found.
type Report struct {
	// Database names the server and its version, as it reports them
	// ("PostgreSQL 15.20", "MariaDB 10.11.19", "SQLite 3.50.4").
	Database string
	// Store is the store URL with its password hidden.
	Store string
	// Tables are the scratch tables the run used (and dropped).
	Tables []string
	// Concurrency, Rounds, Barrier and UniqueCheckTable are the settings
	// the run used.
	Concurrency, Rounds       int
	Barrier, UniqueCheckTable bool
	// Results holds one row per isolation level and strategy, in the order
	// they ran.
	Results []Result
	// Skipped lists the isolation levels the database does not have.
	Skipped []Skipped
}

// Skipped is an isolation level a run left out, and why.
type Skipped struct {
	Isolation Isolation
	Reason    string
}

// Result is what one strategy did at one isolation level. Its JSON form
// has exactly the ten counted fields.
type Result struct {
	Strategy  Strategy  `json:"strategy"`
	Isolation Isolation `json:"isolation"`
	// Rounds is the number of keys raced for.
	Rounds int `json:"rounds"`
	// MaxExecutionsPerKey is the most workers that ran the operation for
	// one key: 1 is right, more is a duplicate, 0 means nobody did.
	MaxExecutionsPerKey int `json:"max_executions_per_key"`
	// Duplicates counts executions beyond the first, over all keys.
	Duplicates int `json:"duplicates"`
	// Deadlocks counts transactions the server rolled back to break a lock
	// wait cycle, or whose lock wait timed out (see LockTimeouts), and on
	// SQLite transactions refused the write lock (SQLITE_BUSY).
	Deadlocks int `json:"deadlocks"`
	// SerializationFailures counts transactions refused because they could
	// not be serialized with the others.
	SerializationFailures int `json:"serialization_failures"`
	// UniqueViolations counts duplicate-key errors that reached the
	// caller as errors (not insert-first's losers, who are told by the
	// same error, or by zero rows, that another caller won).
	UniqueViolations int `json:"unique_violations"`
	// OtherErrors counts every other error.
	OtherErrors int `json:"other_errors"`
	// RoundsPerSec is Rounds over the time they took, to one decimal.
	RoundsPerSec float64 `json:"rounds_per_sec"`

	// Shows says in plain words what the row shows. Not part of the JSON.
	Shows string `json:"-"`
	// NoWinnerRounds counts keys that no worker ran: every worker failed,
	// and the operation happens only if a client retries.
	NoWinnerRounds int `json:"-"`
	// LockTimeouts counts the Deadlocks that were lock wait timeouts.
	LockTimeouts int `json:"-"`
	// BarrierTimeouts counts rounds whose barrier opened on its bound
	// rather than when every worker arrived.
	BarrierTimeouts int `json:"-"`
	// FirstOtherError is the first error counted in OtherErrors.
	FirstOtherError string `json:"-"`
}

// Run creates scratch tables in the database cfg.Store names, plays each
// strategy at each isolation level, drops the tables and returns what it
// counted. The tables are dropped also when Run fails or ctx is cancelled;
// an error says so if dropping failed, with the table's name.
func Run(ctx context.Context, cfg Config) (rep *Report, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	t, err := storeurl.Parse(cfg.Store)
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	d, err := dialectFor(t)
	if err != nil {
		return nil, err
	}
	db, err := d.open(cfg.Concurrency + 2)
	if err != nil {
		d.cleanup()
		return nil, fmt.Errorf("lab: %s: %w", t.Redacted, err)
	}
	defer d.cleanup()
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("lab: %s: %w", t.Redacted, err)
	}
	rep = &Report{Store: t.Redacted, Concurrency: cfg.Concurrency, Rounds: cfg.Rounds,
		Barrier: !cfg.NoBarrier, UniqueCheckTable: cfg.UniqueCheckTable}
	if err := db.QueryRowContext(ctx, d.version).Scan(&rep.Database); err != nil {
		return nil, fmt.Errorf("lab: %s: reading the server version: %w", t.Redacted, err)
	}

	r := &run{cfg: cfg, d: d, db: db, rep: rep}
	base := cfg.tableBase
	if base == "" {
		base = "idem_lab_" + randomHex(4)
	}
	r.checkTable, r.insertTable = base+"_check", base+"_insert"
	defer func() {
		derr := r.dropTables()
		switch {
		case derr != nil:
			err = errors.Join(err, derr)
		case err != nil:
			err = fmt.Errorf("%w (the scratch tables were dropped)", err)
		}
	}()
	if err := r.createTables(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Progress, "idem lab: %s, %d workers, %d rounds per row, scratch tables %s\n",
		rep.Database, cfg.Concurrency, cfg.Rounds, joinNames(rep.Tables))

	defer func() { r.closeWorkers(err != nil) }()
	if err := r.openWorkers(ctx); err != nil {
		return nil, err
	}
	cell := 0
	for _, lvl := range cfg.Isolations {
		if reason := d.skip(lvl); reason != "" {
			rep.Skipped = append(rep.Skipped, Skipped{Isolation: lvl, Reason: reason})
			fmt.Fprintf(cfg.Progress, "idem lab: %s skipped: %s\n", lvl, reason)
			continue
		}
		for _, s := range cfg.Strategies {
			cell++
			res, err := r.cell(ctx, cell, s, lvl)
			if err != nil {
				return nil, err
			}
			res.Shows = shows(d.name, res, cfg)
			rep.Results = append(rep.Results, res)
		}
	}
	return rep, nil
}

// run is the state of one Run.
type run struct {
	cfg     Config
	d       *dialect
	db      *sql.DB
	rep     *Report
	workers []*worker

	checkTable, insertTable string
	created                 []string
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func joinNames(names []string) string {
	s := ""
	for i, n := range names {
		if i > 0 {
			s += " and "
		}
		s += n
	}
	return s
}

func (r *run) createTables(ctx context.Context) error {
	for _, tbl := range []struct {
		name  string
		stmts []string
	}{
		{r.checkTable, r.d.createCheck(r.checkTable, r.cfg.UniqueCheckTable)},
		{r.insertTable, r.d.createInsert(r.insertTable)},
	} {
		r.rep.Tables = append(r.rep.Tables, tbl.name)
		for i, stmt := range tbl.stmts {
			if _, err := r.db.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("lab: creating the scratch table %s: %w", tbl.name, err)
			}
			if i == 0 {
				// Dropped from now on, even if its index fails; never
				// before, so that a name that was taken is not dropped.
				r.created = append(r.created, tbl.name)
			}
		}
	}
	return nil
}

// dropTimeout bounds dropping the scratch tables, which runs also after
// the run's context was cancelled.
const dropTimeout = 30 * time.Second

func (r *run) dropTables() error {
	ctx, cancel := context.WithTimeout(context.Background(), dropTimeout)
	defer cancel()
	var errs []error
	for _, name := range r.created {
		if _, err := r.db.ExecContext(ctx, r.d.drop(name)); err != nil {
			errs = append(errs, fmt.Errorf("lab: could not drop the scratch table %s (drop it by hand): %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// worker is one racer, on a connection of its own for the whole run.
type worker struct {
	n       int
	conn    *sql.Conn
	backend int64 // the server's id of the session, where the dialect has one
	// open is true while a transaction may be open on conn.
	open bool
}

func (r *run) openWorkers(ctx context.Context) error {
	for i := range r.cfg.Concurrency {
		conn, err := r.db.Conn(ctx)
		if err != nil {
			return fmt.Errorf("lab: opening worker connection %d: %w", i+1, err)
		}
		w := &worker{n: i + 1, conn: conn}
		r.workers = append(r.workers, w)
		for _, stmt := range r.d.session {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("lab: setting up worker connection %d: %w", i+1, err)
			}
		}
		if r.d.backendID != "" {
			if err := conn.QueryRowContext(ctx, r.d.backendID).Scan(&w.backend); err != nil {
				return fmt.Errorf("lab: setting up worker connection %d: %w", i+1, err)
			}
		}
	}
	return nil
}

// closeWorkers returns the workers' connections. One that may still hold
// a transaction is closed instead of pooled, and after a failed or
// cancelled run all are, and their server sessions are ended where the
// dialect can (a session waiting for a lock notices its closed connection
// only when the wait ends, and would hold up dropping the tables).
func (r *run) closeWorkers(failed bool) {
	for _, w := range r.workers {
		if w.open || failed {
			w.discard()
		} else {
			w.conn.Close()
		}
	}
	if !failed || r.d.kill == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, w := range r.workers {
		if w.backend != 0 {
			r.db.ExecContext(ctx, r.d.kill(w.backend)) // "unknown thread" when it has gone already
		}
	}
}

// discard closes the worker's connection rather than pooling it.
func (w *worker) discard() {
	w.conn.Raw(func(any) error { return driverErrBadConn })
	w.conn.Close()
}

// cell plays one strategy at one isolation level for cfg.Rounds rounds.
func (r *run) cell(ctx context.Context, cell int, s Strategy, lvl Isolation) (Result, error) {
	res := Result{Strategy: s, Isolation: lvl}
	table := r.checkTable
	if s == InsertFirst {
		table = r.insertTable
	}
	fmt.Fprintf(r.cfg.Progress, "idem lab: %s, %s …\n", lvl, s)
	useBarrier := !r.cfg.NoBarrier && !(r.d.beginLocks != nil && r.d.beginLocks(s))
	start := time.Now()
	lastNote := start
	wins := 0
	for round := range r.cfg.Rounds {
		key := fmt.Sprintf("c%02d-r%07d", cell, round)
		var b *barrier
		if useBarrier {
			b = newBarrier(len(r.workers))
		}
		outs := make([]outcome, len(r.workers))
		gate := make(chan struct{})
		var wg sync.WaitGroup
		var execs atomic.Int32
		for i, w := range r.workers {
			wg.Go(func() {
				<-gate
				var hook func()
				if r.cfg.onArrive != nil {
					hook = func() { r.cfg.onArrive(cell, round, w.n) }
				}
				outs[i] = r.play(ctx, w, s, lvl, table, key, b, hook)
				if outs[i].won {
					execs.Add(1) // the side effect runs here
				}
			})
		}
		close(gate)
		wg.Wait()
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("lab: interrupted in %s, %s, round %d: %w", lvl, s, round+1, err)
		}
		n := int(execs.Load())
		wins += n
		res.Rounds++
		res.MaxExecutionsPerKey = max(res.MaxExecutionsPerKey, n)
		res.Duplicates += max(0, n-1)
		if n == 0 {
			res.NoWinnerRounds++
		}
		timedOut := false
		for _, o := range outs {
			timedOut = timedOut || o.barrierTimeout
			if o.err == nil {
				continue
			}
			switch o.class {
			case classDeadlock:
				res.Deadlocks++
			case classLockTimeout:
				res.Deadlocks++
				res.LockTimeouts++
			case classSerialization:
				res.SerializationFailures++
			case classUnique:
				res.UniqueViolations++
			default:
				res.OtherErrors++
				if res.FirstOtherError == "" {
					res.FirstOtherError = o.err.Error()
				}
			}
		}
		if timedOut {
			res.BarrierTimeouts++
		}
		if r.cfg.afterRound != nil {
			r.cfg.afterRound(cell, round)
		}
		if now := time.Now(); now.Sub(lastNote) >= progressEvery {
			lastNote = now
			fmt.Fprintf(r.cfg.Progress, "idem lab: %s, %s: %d of %d rounds\n", lvl, s, round+1, r.cfg.Rounds)
		}
	}
	elapsed := time.Since(start)
	res.RoundsPerSec = math.Round(float64(res.Rounds)/max(elapsed.Seconds(), 1e-9)*10) / 10
	// The executions counted must be the rows that committed: a check of
	// the lab itself.
	var rows int
	if err := r.db.QueryRowContext(ctx, r.d.countLike(table), fmt.Sprintf("c%02d-%%", cell)).Scan(&rows); err != nil {
		return res, fmt.Errorf("lab: counting the rows of %s, %s: %w", lvl, s, err)
	}
	if rows != wins {
		return res, fmt.Errorf("lab: %s, %s: counted %d executions but %d rows committed", lvl, s, wins, rows)
	}
	fmt.Fprintf(r.cfg.Progress, "idem lab: %s, %s: %d rounds in %v: max %d executions per key, %d duplicates, %d deadlocks, %d serialization failures, %d unique violations, %d other errors\n",
		lvl, s, res.Rounds, elapsed.Round(time.Millisecond), res.MaxExecutionsPerKey, res.Duplicates, res.Deadlocks,
		res.SerializationFailures, res.UniqueViolations, res.OtherErrors)
	if res.FirstOtherError != "" {
		fmt.Fprintf(r.cfg.Progress, "idem lab: %s, %s: first other error: %s\n", lvl, s, res.FirstOtherError)
	}
	return res, nil
}

// progressEvery is how often a long row reports how far it got.
const progressEvery = 5 * time.Second

package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/testenv"
)

// The tests run workers as child processes (this test binary, re-executed)
// and kill them with SIGKILL mid-job, as a crash or an OOM kill would.
const (
	childEnv  = "PAYOUT_WORKER_CHILD" // the schema to work
	crashEnv  = "PAYOUT_WORKER_CRASH" // "in-tx", "committed" or ""
	crashLine = "crash-point "
)

// Child workers use short times, so that a dead worker's job comes back in
// seconds: River rescues a job running for longer than 2s, and idem's lease
// on a payout lasts 2s unless renewed.
const (
	childLease  = 2 * time.Second
	childRescue = 2 * time.Second
)

func TestMain(m *testing.M) {
	if schema := os.Getenv(childEnv); schema != "" {
		os.Exit(child(schema, os.Getenv(crashEnv)))
	}
	os.Exit(m.Run())
}

// child works payouts from schema until SIGTERM. With crash set, it stops
// dead at that point of its first payout, prints the crash line, and waits
// to be killed.
func child(schema, crash string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_TEST_POSTGRES_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	client, store, w, err := NewWorker(pool, schema, Options{
		Lease:  childLease,
		Logger: logger,
		River:  river.Config{JobTimeout: childRescue, RescueStuckJobsAfter: childRescue, TestOnly: true},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer store.Close()
	hang := func(args PayoutArgs) {
		fmt.Println(crashLine + args.PayoutID)
		select {} // until SIGKILL
	}
	switch crash {
	case "in-tx":
		w.inTx = hang
	case "committed":
		w.committed = hang
	}
	if err := client.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	<-ctx.Done()
	<-client.Stopped()
	return 0
}

// proc is a child worker.
type proc struct {
	cmd   *exec.Cmd
	lines chan string // its stdout
	logs  string      // the file of its stderr
}

func startWorker(t *testing.T, schema, crash string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"="+schema, crashEnv+"="+crash)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, lines: make(chan string, 16), logs: filepath.Join(t.TempDir(), "stderr")}
	stderr, err := os.Create(p.logs)
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close() // the child has its own copy
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			p.lines <- s.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		if t.Failed() {
			t.Logf("worker %d (crash %q) logs:\n%s", cmd.Process.Pid, crash, p.stderrText(t))
		}
	})
	return p
}

// waitLine waits for the child to print want.
func (p *proc) waitLine(t *testing.T, want string) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				t.Fatalf("the worker exited before printing %q", want)
			}
			if line == want {
				return
			}
		case <-timeout:
			t.Fatalf("the worker did not print %q within a minute", want)
		}
	}
}

// kill ends the child with SIGKILL: no deferred call, no settlement, no
// word to River.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
}

// stop ends the child with SIGTERM, as a deploy would, and checks it exited
// cleanly.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("worker: %v", err)
	}
}

// stderrText returns what the child wrote to stderr so far.
func (p *proc) stderrText(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(p.logs)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// fixture is a fresh schema with River's, idem's and the ledger's tables.
type fixture struct {
	pool   *pgxpool.Pool
	schema string
	river  *river.Client[pgx.Tx]
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	url := testenv.Getenv(t, "IDEM_TEST_POSTGRES_URL")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var b [6]byte
	rand.Read(b[:])
	schema := "payout_t_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	if err := Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	inserter, err := NewInserter(pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{pool: pool, schema: schema, river: inserter}
}

func (f *fixture) ledgerRows(t *testing.T, payoutID string) int {
	t.Helper()
	var n int
	err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{f.schema, "ledger"}.Sanitize()+` WHERE payout_id = $1`, payoutID).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *fixture) job(t *testing.T, id int64) *rivertype.JobRow {
	t.Helper()
	j, err := f.river.JobGet(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// record returns idem's record of the payout.
func (f *fixture) record(t *testing.T, payoutID string) (state, token string) {
	t.Helper()
	err := f.pool.QueryRow(context.Background(), `SELECT state, token FROM `+pgx.Identifier{f.schema, "idem_records"}.Sanitize()+
		` WHERE scope = 'payouts' AND operation = 'payout' AND key = $1`, payoutID).Scan(&state, &token)
	if err != nil {
		t.Fatal(err)
	}
	return state, token
}

// eventually polls cond until it holds, for at most a minute: the child
// processes work on their own time.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		<-tick.C
	}
}

// redeliver makes River hand a dead worker's job to the next worker: the
// dead worker was River's leader (it was alone), and its leadership would
// hold for River's leader TTL (15s); clearing it, as a worker that stops
// cleanly does, lets the next worker lead, and so rescue stuck jobs, at
// once. The job is stuck once it has been running for childRescue by the
// database's clock; then the next worker's rescuer, which runs as it starts
// leading, sends it back to the queue.
func (f *fixture) redeliver(t *testing.T, jobID int64) {
	t.Helper()
	if _, err := f.pool.Exec(context.Background(), `DELETE FROM `+pgx.Identifier{f.schema, "river_leader"}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the job is stuck", func() bool {
		var stuck bool
		err := f.pool.QueryRow(context.Background(), `SELECT attempted_at < now() - make_interval(secs => $2)
			FROM `+pgx.Identifier{f.schema, "river_job"}.Sanitize()+` WHERE id = $1`, jobID, childRescue.Seconds()).Scan(&stuck)
		if err != nil {
			t.Fatal(err)
		}
		return stuck
	})
}

// crashAndRedeliver enqueues args and starts a worker that stops dead at
// crash in the payout; atCrash checks what the database shows then. It
// kills that worker, lets River deliver the job again to a second worker,
// waits for the job to complete and stops the second worker. It returns the
// job and the second worker's logs.
func (f *fixture) crashAndRedeliver(t *testing.T, args PayoutArgs, crash string, atCrash func()) (*rivertype.JobRow, string) {
	t.Helper()
	res, err := f.river.Insert(context.Background(), args, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := res.Job.ID
	first := startWorker(t, f.schema, crash)
	first.waitLine(t, crashLine+args.PayoutID)
	if state := f.job(t, id).State; state != rivertype.JobStateRunning {
		t.Fatalf("at the crash point the job is %s", state)
	}
	atCrash()
	first.kill(t)

	f.redeliver(t, id)
	second := startWorker(t, f.schema, "")
	eventually(t, "the job completes", func() bool { return f.job(t, id).State == rivertype.JobStateCompleted })
	second.stop(t)
	job := f.job(t, id)
	if len(slices.Compact(slices.Clone(job.AttemptedBy))) != 2 {
		t.Fatalf("job attempted by %v: River did not deliver it to both workers", job.AttemptedBy)
	}
	return job, second.stderrText(t)
}

// TestKilledAfterCommit kills the worker after its payout committed and
// before River heard the job was done. River delivers the job again; the
// second worker's DoTx finds the payout completed and replays it: the
// ledger has one row.
func TestKilledAfterCommit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	args := PayoutArgs{PayoutID: "po_1", Account: "acct_42", Amount: 500}
	job, logs := f.crashAndRedeliver(t, args, "committed", func() {
		if n := f.ledgerRows(t, "po_1"); n != 1 {
			t.Fatalf("at the crash point: %d ledger rows", n)
		}
		if state, _ := f.record(t, "po_1"); state != "completed" {
			t.Fatalf("idem's record is %s", state)
		}
	})
	if n := f.ledgerRows(t, "po_1"); n != 1 {
		t.Fatalf("the payout was written %d times", n)
	}
	if job.Attempt != 2 || !strings.Contains(logs, "payout recorded") {
		t.Fatalf("attempt %d; the second worker's logs:\n%s", job.Attempt, logs)
	}
}

// TestKilledInTransaction kills the worker while its payout's transaction
// is open: the row never commits. River delivers the job again; the second
// worker finds idem's key still held by the dead worker's lease, snoozes
// until it expires, takes the key over and pays out: one row.
func TestKilledInTransaction(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	args := PayoutArgs{PayoutID: "po_2", Account: "acct_42", Amount: 700}
	var deadToken string
	_, logs := f.crashAndRedeliver(t, args, "in-tx", func() {
		if n := f.ledgerRows(t, "po_2"); n != 0 {
			t.Fatalf("an uncommitted row is visible: %d", n)
		}
		var state string
		if state, deadToken = f.record(t, "po_2"); state != "pending" {
			t.Fatalf("idem's record is %s", state)
		}
	})
	if n := f.ledgerRows(t, "po_2"); n != 1 {
		t.Fatalf("the payout was written %d times", n)
	}
	if state, token := f.record(t, "po_2"); state != "completed" || token == deadToken {
		t.Fatalf("idem's record: %s, under the dead worker's token: %v", state, token == deadToken)
	}
	if !strings.Contains(logs, "took over an expired lease") {
		t.Fatalf("the second worker did not take the key over:\n%s", logs)
	}
}

// A payout ID reused with other arguments is refused, not paid out again.
func TestPayoutIDReusedIsCancelled(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	worker := startWorker(t, f.schema, "")
	a, err := f.river.Insert(ctx, PayoutArgs{PayoutID: "po_3", Account: "acct_42", Amount: 500}, nil)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first job completes", func() bool { return f.job(t, a.Job.ID).State == rivertype.JobStateCompleted })
	b, err := f.river.Insert(ctx, PayoutArgs{PayoutID: "po_3", Account: "acct_42", Amount: 900}, nil)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the second job is cancelled", func() bool { return f.job(t, b.Job.ID).State == rivertype.JobStateCancelled })
	worker.stop(t)
	if n := f.ledgerRows(t, "po_3"); n != 1 {
		t.Fatalf("%d ledger rows", n)
	}
	if errs := f.job(t, b.Job.ID).Errors; len(errs) == 0 || !strings.Contains(errs[len(errs)-1].Error, idem.ErrMismatch.Error()) {
		t.Fatalf("job errors %+v", errs)
	}
}

func TestPayoutRequest(t *testing.T) {
	t.Parallel()
	a, err := payoutRequest(PayoutArgs{PayoutID: "po_1", Account: "x", Amount: 1})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := payoutRequest(PayoutArgs{PayoutID: "po_1", Account: "x", Amount: 2})
	if a.Key != b.Key || a.Fingerprint == b.Fingerprint || a.Kind != idem.Transactional {
		t.Fatalf("requests %+v, %+v", a, b)
	}
	if _, err := payoutRequest(PayoutArgs{}); err == nil {
		t.Fatal("a payout without an ID was accepted")
	}
	if err := run("", "s", 0); err == nil {
		t.Fatal("run without a database did not fail")
	}
}

// Package msgchaos runs the chaos tests of the broker front doors
// (idemwatermill on RabbitMQ and on PostgreSQL through watermill-sql,
// idemnats on NATS JetStream): child consumer processes (the test binary,
// run again) share one queue or stream and one PostgreSQL database, and are
// killed with SIGKILL while handlers run and between completion and ack;
// they also kill themselves at those points, drop acks and fail messages
// so that the broker delivers them again. Each handler writes a row to a
// ledger table in the transaction that completes its idem lease, and
// produces one message. After the faults stop and the consumers drain the
// queue, Check verifies that every message's ledger row was written
// exactly once, that none was lost, and that every produced message seen
// downstream carries the ID its ledger row recorded.
package msgchaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/internal/testenv"
)

// Environment of a child consumer.
const (
	// ChildEnv names the child's role; its presence makes the test binary a
	// child (see TestMain in the tests that use this package).
	ChildEnv = "IDEM_MSGCHAOS_CHILD"
	// SchemaEnv is the PostgreSQL schema of idem's tables and the ledger.
	SchemaEnv = "IDEM_MSGCHAOS_SCHEMA"
	// NameEnv names the run's queue, topic or stream.
	NameEnv = "IDEM_MSGCHAOS_NAME"
	// FaultsEnv is "1" while the child should fail on its own.
	FaultsEnv = "IDEM_MSGCHAOS_FAULTS"
)

// Settings are a run's size: how long faults last and how many messages
// are published meanwhile. 20s and 1000 messages by default; 3 minutes and
// 10000 with IDEM_CHAOS=long (make chaos); IDEM_MSGCHAOS_DURATION (a Go
// duration) sets the fault phase, with messages in proportion.
func Settings() (faults time.Duration, messages int) {
	faults, messages = 20*time.Second, 1000
	if os.Getenv("IDEM_CHAOS") == "long" {
		faults, messages = 3*time.Minute, 10000
	}
	if d, err := time.ParseDuration(os.Getenv("IDEM_MSGCHAOS_DURATION")); err == nil && d > 0 {
		messages = max(1000, int(float64(messages)*d.Seconds()/faults.Seconds()))
		faults = d
	}
	return faults, messages
}

// Chance reports true with probability p, on a cryptographic source so
// that children started at the same moment do not fail in step.
func Chance(p float64) bool {
	n, err := rand.Int(rand.Reader, big.NewInt(1_000_000))
	return err == nil && float64(n.Int64()) < p*1_000_000
}

// Faulty reports whether this child should fail on its own.
func Faulty() bool { return os.Getenv(FaultsEnv) == "1" }

// Crash kills this process with SIGKILL: no deferred call, no ack, no
// settlement.
func Crash() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// RandomName is a fresh name for a schema, queue or stream.
func RandomName(prefix string) string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// DB is a fresh PostgreSQL schema with idem's tables and the ledger, for
// one run.
type DB struct {
	Pool   *pgxpool.Pool
	Schema string
	URL    string
}

// NewDB creates the run's schema (dropped when the test ends).
func NewDB(t testing.TB) *DB {
	t.Helper()
	url := testenv.Getenv(t, "IDEM_TEST_POSTGRES_URL")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db := &DB{Pool: pool, Schema: RandomName("msgchaos_"), URL: url}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{db.Schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	if err := Migrate(ctx, pool, db.Schema); err != nil {
		t.Fatal(err)
	}
	return db
}

// Migrate creates schema with idem's tables and the ledger. The ledger has
// no unique constraint on msg_id on purpose: exactly once must be idem's
// doing, and a second row must be seen if it happens.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return err
	}
	if err := idempg.Migrate(ctx, pool, idempg.Config{Schema: schema}); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+pgx.Identifier{schema, "ledger"}.Sanitize()+` (
		id bigserial PRIMARY KEY,
		msg_id text NOT NULL,
		produced_id text NOT NULL,
		pid integer NOT NULL,
		at timestamptz NOT NULL DEFAULT now())`)
	return err
}

// InsertLedger writes msgID's ledger row in tx: the handler's side effect.
func InsertLedger(ctx context.Context, tx pgx.Tx, schema, msgID, producedID string) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "ledger"}.Sanitize()+` (msg_id, produced_id, pid) VALUES ($1, $2, $3)`,
		msgID, producedID, os.Getpid())
	return err
}

// Handled returns how many distinct messages have a ledger row.
func (db *DB) Handled(ctx context.Context) (int, error) {
	var n int
	err := db.Pool.QueryRow(ctx, `SELECT count(DISTINCT msg_id) FROM `+pgx.Identifier{db.Schema, "ledger"}.Sanitize()).Scan(&n)
	return n, err
}

// Ledger returns every message's ledger rows: the produced IDs they
// recorded, one per row.
func (db *DB) Ledger(ctx context.Context) (map[string][]string, error) {
	rows, err := db.Pool.Query(ctx, `SELECT msg_id, produced_id FROM `+pgx.Identifier{db.Schema, "ledger"}.Sanitize()+` ORDER BY id`)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for rows.Next() {
		var id, produced string
		if err := rows.Scan(&id, &produced); err != nil {
			return nil, err
		}
		out[id] = append(out[id], produced)
	}
	return out, rows.Err()
}

// Records counts idem's records by state.
func (db *DB) Records(ctx context.Context) (map[string]int, error) {
	rows, err := db.Pool.Query(ctx, `SELECT state, count(*) FROM `+pgx.Identifier{db.Schema, "idem_records"}.Sanitize()+` GROUP BY state`)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for rows.Next() {
		var state string
		var n int
		if err := rows.Scan(&state, &n); err != nil {
			return nil, err
		}
		out[state] = n
	}
	return out, rows.Err()
}

// Check verifies the run: every published message has exactly one ledger
// row, no row belongs to a message that was not published, and every
// produced message seen downstream for a message carries the ID its
// ledger row recorded (seen may hold an ID several times: outputs are at
// least once, with stable IDs).
func Check(t testing.TB, published []string, ledger map[string][]string, seen map[string][]string) {
	t.Helper()
	want := make(map[string]bool, len(published))
	lost, twice, wrong := 0, 0, 0
	for _, id := range published {
		want[id] = true
		rows := ledger[id]
		switch {
		case len(rows) == 0:
			lost++
			if lost <= 5 {
				t.Errorf("message %s: no ledger row (lost)", id)
			}
			continue
		case len(rows) > 1:
			twice++
			if twice <= 5 {
				t.Errorf("message %s: %d ledger rows (handled more than once)", id, len(rows))
			}
		}
		if len(seen[id]) == 0 {
			wrong++
			if wrong <= 5 {
				t.Errorf("message %s: its produced message %s was never seen", id, rows[0])
			}
		}
		for _, p := range seen[id] {
			if p != rows[0] {
				wrong++
				if wrong <= 5 {
					t.Errorf("message %s: produced message seen with ID %s, ledger says %s", id, p, rows[0])
				}
			}
		}
	}
	for id := range ledger {
		if !want[id] {
			t.Errorf("ledger row for %s, which was never published", id)
		}
	}
	if lost+twice+wrong > 0 {
		t.Errorf("%d messages: %d lost, %d handled more than once, %d with produced messages missing or under another ID", len(published), lost, twice, wrong)
	}
}

// Fleet is a set of child consumers (the test binary run again with env
// and ChildEnv=role), restarted whenever they die.
type Fleet struct {
	t    testing.TB
	role string
	dir  string

	mu     sync.Mutex
	env    []string
	procs  []*proc
	starts int
	kills  int
}

type proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// NewFleet starts n children of role with env.
func NewFleet(t testing.TB, role string, n int, env []string) *Fleet {
	t.Helper()
	f := &Fleet{t: t, role: role, dir: t.TempDir(), env: env, procs: make([]*proc, n)}
	for i := range f.procs {
		if err := f.start(i); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { f.Stop(0) })
	return f
}

func (f *Fleet) start(i int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), f.env...), ChildEnv+"="+f.role)
	log, err := os.OpenFile(filepath.Join(f.dir, "child-"+strconv.Itoa(i)+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close() // the child has its own copy
	fmt.Fprintf(log, "=== %s: start\n", time.Now().Format(time.RFC3339Nano))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return err
	}
	p := &proc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	f.procs[i] = p
	f.starts++
	return nil
}

// SetEnv changes the environment of children started from now on.
func (f *Fleet) SetEnv(env []string) {
	f.mu.Lock()
	f.env = env
	f.mu.Unlock()
}

// Tend restarts the children that died.
func (f *Fleet) Tend() {
	for i := range f.procs {
		f.mu.Lock()
		p := f.procs[i]
		f.mu.Unlock()
		select {
		case <-p.exited:
			if err := f.start(i); err != nil {
				f.t.Error(err)
			}
		default:
		}
	}
}

// KillOne kills child i with SIGKILL and starts it again.
func (f *Fleet) KillOne(i int) {
	f.mu.Lock()
	p := f.procs[i]
	f.kills++
	f.mu.Unlock()
	_ = p.cmd.Process.Kill()
	<-p.exited
	if err := f.start(i); err != nil {
		f.t.Error(err)
	}
}

// Size is the number of children.
func (f *Fleet) Size() int { return len(f.procs) }

// Stats returns how many times children were started and killed.
func (f *Fleet) Stats() (starts, kills int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts, f.kills
}

// Stop ends every child with SIGTERM, and SIGKILL after grace.
func (f *Fleet) Stop(grace time.Duration) {
	f.mu.Lock()
	procs := append([]*proc(nil), f.procs...)
	f.mu.Unlock()
	for _, p := range procs {
		if p != nil {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, p := range procs {
		if p == nil {
			continue
		}
		t := time.NewTimer(grace)
		select {
		case <-p.exited:
		case <-t.C:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		t.Stop()
	}
}

// Logs returns the children's logs, for a failed test.
func (f *Fleet) Logs() string {
	var out []byte
	entries, _ := os.ReadDir(f.dir)
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(f.dir, e.Name()))
		if len(b) > 64<<10 {
			b = b[len(b)-64<<10:]
		}
		out = append(out, "--- "+e.Name()+"\n"...)
		out = append(out, b...)
	}
	return string(out)
}

// Run is one chaos run's plan.
type Run struct {
	DB    *DB
	Fleet *Fleet
	// Publish publishes the message id.
	Publish func(ctx context.Context, id string) error
	// Faults is how long faults last; Messages how many are published,
	// at a steady pace over the first four fifths of it.
	Faults   time.Duration
	Messages int
	// Calm is the children's environment once faults stop.
	Calm []string
	// Drain bounds the wait for every message to be handled after the
	// faults. Defaults to two minutes.
	Drain time.Duration
}

// Go publishes the messages while killing children at random (SIGKILL,
// every one to three seconds), then restarts every child without faults
// and waits until every message has been handled. It returns the IDs
// published.
func (r *Run) Go(t testing.TB) []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ids := make([]string, r.Messages)
	for i := range ids {
		ids[i] = fmt.Sprintf("m-%06d", i)
	}
	published := make(chan error, 1)
	go func() {
		pace := time.Duration(float64(r.Faults) * 0.8 / float64(len(ids)))
		next := time.Now()
		for _, id := range ids {
			if err := r.Publish(ctx, id); err != nil {
				published <- fmt.Errorf("publishing %s: %w", id, err)
				return
			}
			next = next.Add(pace)
			if d := time.Until(next); d > 0 {
				time.Sleep(d) // pacing the producer, not synchronising
			}
		}
		published <- nil
	}()
	end := time.Now().Add(r.Faults)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	nextKill := time.Now().Add(randomDuration(time.Second, 3*time.Second))
	for time.Now().Before(end) {
		<-tick.C
		r.Fleet.Tend()
		if time.Now().After(nextKill) {
			n, _ := rand.Int(rand.Reader, big.NewInt(int64(r.Fleet.Size())))
			r.Fleet.KillOne(int(n.Int64()))
			nextKill = time.Now().Add(randomDuration(time.Second, 3*time.Second))
		}
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	r.Fleet.SetEnv(r.Calm)
	for i := 0; i < r.Fleet.Size(); i++ {
		r.Fleet.KillOne(i) // the last fault, and a restart without faults
	}
	drain := r.Drain
	if drain == 0 {
		drain = 2 * time.Minute
	}
	deadline := time.Now().Add(drain)
	for {
		n, err := r.DB.Handled(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n >= len(ids) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("after %v without faults, %d of %d messages handled", drain, n, len(ids))
			break
		}
		<-tick.C
		r.Fleet.Tend()
	}
	return ids
}

func randomDuration(lo, hi time.Duration) time.Duration {
	n, _ := rand.Int(rand.Reader, big.NewInt(int64(hi-lo)))
	return lo + time.Duration(n.Int64())
}

// Seen collects the produced messages a run's downstream consumer saw:
// input ID -> produced IDs, as Check takes them.
type Seen struct {
	mu  sync.Mutex
	ids map[string][]string
}

// NewSeen returns an empty Seen.
func NewSeen() *Seen { return &Seen{ids: map[string][]string{}} }

// Add records a produced message with ID produced for the input in.
func (s *Seen) Add(in, produced string) {
	s.mu.Lock()
	s.ids[in] = append(s.ids[in], produced)
	s.mu.Unlock()
}

// All returns a copy of what was seen.
func (s *Seen) All() map[string][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]string, len(s.ids))
	for k, v := range s.ids {
		out[k] = append([]string(nil), v...)
	}
	return out
}

// Wait waits, a minute at most, until produced messages of n inputs were
// seen (polling: the broker delivers them in its own time).
func (s *Seen) Wait(n int) {
	deadline := time.Now().Add(time.Minute)
	for {
		s.mu.Lock()
		got := len(s.ids)
		s.mu.Unlock()
		if got >= n || time.Now().After(deadline) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Verify checks a finished run (Check on the ledger and what was seen
// downstream, and every idem record completed), logs its size, and on
// failure the children's logs.
func Verify(t testing.TB, db *DB, fleet *Fleet, ids []string, seen *Seen, faults time.Duration) {
	t.Helper()
	ctx := context.Background()
	ledger, err := db.Ledger(ctx)
	if err != nil {
		t.Fatal(err)
	}
	Check(t, ids, ledger, seen.All())
	records, err := db.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	starts, kills := fleet.Stats()
	t.Logf("%d messages in %v of faults; consumers started %d times, killed %d times by the test; idem records by state: %v", len(ids), faults, starts, kills, records)
	if records["completed"] != len(ids) {
		t.Errorf("idem records %v; want all %d completed", records, len(ids))
	}
	if t.Failed() {
		t.Log(fleet.Logs())
	}
}

// Package msgbench is what the broker front doors' benchmarks share: the
// stores they measure idem on, and the small piece of work their handlers
// do. scripts/bench-messages.sh runs the benchmarks and prints the figures.
package msgbench

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idempg"
	"github.com/idem-dev/idem/internal/msgchaos"
	"github.com/idem-dev/idem/internal/proccpu"
	"github.com/idem-dev/idem/internal/storeurl"
	"github.com/idem-dev/idem/internal/testenv"
)

// Store is one variant of a benchmark: bare (Engine returns nil: no idem)
// or idem on a store.
type Store struct {
	Name string
	// Engine opens a fresh engine (a fresh schema, key prefix or file), or
	// returns nil for the bare consumer.
	Engine func(b *testing.B) *idem.Engine
}

// Stores returns the bare consumer and idem on memory, SQLite, and the
// PostgreSQL and Redis of IDEM_TEST_POSTGRES_URL and IDEM_TEST_REDIS_URL
// (those two skip when unset, or fail under CI=true).
func Stores() []Store {
	open := func(url func(b *testing.B) string) func(b *testing.B) *idem.Engine {
		return func(b *testing.B) *idem.Engine {
			b.Helper()
			store, closeStore, err := storeurl.Open(context.Background(), url(b), storeurl.Options{Migrate: true, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = closeStore() })
			e, err := idem.NewEngine(store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			return e
		}
	}
	return []Store{
		{"bare", func(*testing.B) *idem.Engine { return nil }},
		{"memory", open(func(*testing.B) string { return "memory://" })},
		{"sqlite", open(func(b *testing.B) string { return "sqlite://" + filepath.Join(b.TempDir(), "idem.db") })},
		{"postgres", open(func(b *testing.B) string {
			url := testenv.Getenv(b, "IDEM_TEST_POSTGRES_URL")
			return testenv.WithParam(url, "schema", msgchaos.RandomName("msgbench_"))
		})},
		{"redis", open(func(b *testing.B) string {
			return testenv.WithParam(testenv.Getenv(b, "IDEM_TEST_REDIS_URL"), "prefix", msgchaos.RandomName("msgbench_"))
		})},
	}
}

// Consumers is how many messages a benchmark handles at once, as a team
// would configure its consumer: IDEM_BENCH_CONSUMERS, 16 by default.
func Consumers() int {
	if n, err := strconv.Atoi(os.Getenv("IDEM_BENCH_CONSUMERS")); err == nil && n > 0 {
		return n
	}
	return 16
}

// Order is the benchmarks' message.
type Order struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	Amount   int64  `json:"amount"`
}

// Payload is the JSON of order i.
func Payload(i int) []byte {
	b, _ := json.Marshal(Order{ID: "order-" + strconv.Itoa(i), Customer: "customer-" + strconv.Itoa(i%97), Amount: int64(100 + i)})
	return b
}

var workKey = []byte("msgbench")

// Work is a handler's realistic tiny amount of work: it decodes the order
// and signs a receipt for it.
func Work(payload []byte) ([]byte, error) {
	var o Order
	if err := json.Unmarshal(payload, &o); err != nil {
		return nil, err
	}
	mac := hmac.New(sha256.New, workKey)
	fmt.Fprintf(mac, "%s:%s:%d", o.ID, o.Customer, o.Amount)
	return mac.Sum(nil), nil
}

// Meter measures a benchmark's timed part: its wall time, and the CPU
// time of this process (the consumer and idem's store client), of the
// brokers (RabbitMQ's beam.smp, nats-server) and of the stores' servers
// (postgres, redis-server) on this machine, from /proc. The servers' CPU
// counts every process of those names: the figures want a machine that
// runs nothing else.
type Meter struct {
	start           time.Time
	self            time.Duration
	broker, servers *proccpu.Meter
}

// Start starts a Meter; call it right before the timed part.
func Start() *Meter {
	return &Meter{
		start:   time.Now(),
		self:    proccpu.Self(),
		broker:  proccpu.Start(func() []int { return proccpu.Named("beam.smp", "nats-server") }),
		servers: proccpu.Start(func() []int { return proccpu.Named("postgres", "redis-server") }),
	}
}

// Report records n messages handled since m started: msgs/s, and the CPU
// time per message of this process (consumer-µs/msg), of the brokers
// (broker-µs/msg) and of the stores' servers (store-µs/msg), which the
// bare consumer's ledger variant uses too.
func (m *Meter) Report(b *testing.B, n int) {
	elapsed := time.Since(m.start)
	self, broker, servers := proccpu.Self()-m.self, m.broker.Elapsed(), m.servers.Elapsed()
	b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	b.ReportMetric(per(self), "consumer-µs/msg")
	b.ReportMetric(per(broker), "broker-µs/msg")
	b.ReportMetric(per(servers), "store-µs/msg")
}

// LedgerDB is a fresh PostgreSQL schema with idem's tables and a ledger,
// for the benchmarks whose handlers write a row (the ledger variants),
// and the idem store on it.
type LedgerDB struct {
	Pool   *pgxpool.Pool
	Schema string
	Store  *idempg.Store
	Engine *idem.Engine
}

// NewLedgerDB creates it; it is dropped when b ends.
func NewLedgerDB(b *testing.B) *LedgerDB {
	b.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.Getenv(b, "IDEM_TEST_POSTGRES_URL"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	schema := msgchaos.RandomName("msgbench_")
	b.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	if err := msgchaos.Migrate(ctx, pool, schema); err != nil {
		b.Fatal(err)
	}
	store, err := idempg.New(pool, idempg.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	e, err := idem.NewEngine(store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	return &LedgerDB{Pool: pool, Schema: schema, Store: store, Engine: e}
}

// Book is the ledger variants' handler work: Work, then message id's
// ledger row in a transaction, in which complete (when not nil: idem's
// CompleteTx) runs before the commit.
func (l *LedgerDB) Book(ctx context.Context, id string, payload []byte, complete func(tx pgx.Tx) error) error {
	sig, err := Work(payload)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, l.Pool, func(tx pgx.Tx) error {
		if err := msgchaos.InsertLedger(ctx, tx, l.Schema, id, fmt.Sprintf("%x", sig[:8])); err != nil {
			return err
		}
		if complete != nil {
			return complete(tx)
		}
		return nil
	})
}

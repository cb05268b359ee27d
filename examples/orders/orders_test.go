package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-dev/idem/internal/testenv"
)

// The crash test runs consumers as child processes (this test binary, run
// again) and kills one with SIGKILL after its booking committed, before
// RabbitMQ heard of it.
const (
	childEnv  = "ORDERS_CHILD" // "schema topic"
	crashEnv  = "ORDERS_CRASH" // "committed" or ""
	crashLine = "crash-point "
)

func TestMain(m *testing.M) {
	if v := os.Getenv(childEnv); v != "" {
		schema, topic, _ := strings.Cut(v, " ")
		os.Exit(child(schema, topic, os.Getenv(crashEnv) == "committed"))
	}
	os.Exit(testenv.VerifyNoLeaks(m, testenv.LeakGrace))
}

// fixture is a fresh schema and fresh queues.
type fixture struct {
	pool   *pgxpool.Pool
	schema string
	topics Topics
	pub    *amqp.Publisher
	sub    *amqp.Subscriber
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pgURL := testenv.Getenv(t, "IDEM_TEST_POSTGRES_URL")
	amqpURL := testenv.Getenv(t, "IDEM_TEST_AMQP_URL")
	var b [5]byte
	_, _ = rand.Read(b[:])
	name := "orders_t_" + hex.EncodeToString(b[:])
	pool, err := pgxpool.New(context.Background(), pgURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	if err := Migrate(context.Background(), pool, name); err != nil {
		t.Fatal(err)
	}
	f := &fixture{pool: pool, schema: name, topics: Topics{Orders: name}.withDefaults()}
	cfg := amqp.NewDurableQueueConfig(amqpURL)
	if f.pub, err = amqp.NewPublisher(cfg, watermill.NopLogger{}); err != nil {
		t.Fatal(err)
	}
	if f.sub, err = amqp.NewSubscriber(cfg, watermill.NopLogger{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.pub.Close()
		f.sub.Close()
		deleteQueues(amqpURL, f.topics.Orders, f.topics.Receipts, f.topics.Poison)
	})
	for _, q := range []string{f.topics.Orders, f.topics.Receipts, f.topics.Poison} {
		if err := f.sub.SubscribeInitialize(q); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// consume runs a consumer in this process until the test ends.
func (f *fixture) consume(t *testing.T) {
	t.Helper()
	router, c, err := NewRouter(f.pool, f.schema, f.sub, f.pub, Options{Topics: f.topics, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := router.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		c.Store.Close()
	})
	<-router.Running()
}

func (f *fixture) publish(t *testing.T, uuid string, o Order) {
	t.Helper()
	body, _ := json.Marshal(o)
	if err := f.pub.Publish(f.topics.Orders, message.NewMessage(uuid, body)); err != nil {
		t.Fatal(err)
	}
}

// next returns the next message of topic.
func (f *fixture) next(t *testing.T, topic string) *message.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msgs, err := f.sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-msgs:
		m.Ack()
		return m
	case <-ctx.Done():
		t.Fatalf("nothing on %s within a minute", topic)
		return nil
	}
}

func (f *fixture) ledgerRows(t *testing.T, uuid string) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{f.schema, "ledger"}.Sanitize()+` WHERE order_uuid = $1`, uuid).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// An order delivered twice (a producer's retry, or RabbitMQ's redelivery)
// is booked once, and both deliveries emit the same receipt.
func TestDeliveredTwiceBooksOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.consume(t)
	uuid := watermill.NewUUID()
	f.publish(t, uuid, Order{Customer: "ada", Amount: 500})
	first := f.next(t, f.topics.Receipts)
	f.publish(t, uuid, Order{Customer: "ada", Amount: 500})
	again := f.next(t, f.topics.Receipts)
	if first.UUID != again.UUID || string(first.Payload) != string(again.Payload) {
		t.Fatalf("receipts %s %s and %s %s; want the same twice", first.UUID, first.Payload, again.UUID, again.Payload)
	}
	if n := f.ledgerRows(t, uuid); n != 1 {
		t.Fatalf("%d ledger rows", n)
	}
}

// An order UUID reused for another order, and a malformed order, go to the
// poison queue; nothing more is booked.
func TestPoison(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.consume(t)
	uuid := watermill.NewUUID()
	f.publish(t, uuid, Order{Customer: "ada", Amount: 500})
	f.next(t, f.topics.Receipts)
	f.publish(t, uuid, Order{Customer: "ada", Amount: 5000})
	if p := f.next(t, f.topics.Poison); p.UUID != uuid || !strings.Contains(p.Metadata.Get("reason_poisoned"), "mismatch") {
		t.Fatalf("poisoned %s with %v", p.UUID, p.Metadata)
	}
	bad := watermill.NewUUID()
	f.publish(t, bad, Order{Amount: -1})
	if p := f.next(t, f.topics.Poison); p.UUID != bad {
		t.Fatalf("poisoned %s, want the malformed order %s", p.UUID, bad)
	}
	if n := f.ledgerRows(t, uuid) + f.ledgerRows(t, bad); n != 1 {
		t.Fatalf("%d ledger rows", n)
	}
}

// A consumer killed after the booking committed, before its ack: RabbitMQ
// delivers the order to the next consumer, which books nothing more and
// publishes the receipt the first one stored, with its UUID.
func TestKilledAfterCommit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	uuid := watermill.NewUUID()
	crashed := startConsumer(t, f, true)
	f.publish(t, uuid, Order{Customer: "ada", Amount: 500})
	crashed.waitLine(t, crashLine+uuid)
	crashed.kill(t)
	var stored string
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*)::text FROM `+pgx.Identifier{f.schema, "idem_records"}.Sanitize()+` WHERE key = $1 AND state = 'completed'`, uuid).Scan(&stored); err != nil || stored != "1" {
		t.Fatalf("the killed consumer's booking did not commit: %v %v", stored, err)
	}
	startConsumer(t, f, false)
	receipt := f.next(t, f.topics.Receipts)
	if got := receipt.Metadata.Get("order_uuid"); got != uuid {
		t.Fatalf("receipt for %s", got)
	}
	var ledgerID int64
	if err := f.pool.QueryRow(context.Background(), `SELECT id FROM `+pgx.Identifier{f.schema, "ledger"}.Sanitize()+` WHERE order_uuid = $1`, uuid).Scan(&ledgerID); err != nil {
		t.Fatal(err)
	}
	var r Receipt
	if err := json.Unmarshal(receipt.Payload, &r); err != nil || r.LedgerID != ledgerID {
		t.Fatalf("receipt %s (%v); want ledger row %d's", receipt.Payload, err, ledgerID)
	}
	if n := f.ledgerRows(t, uuid); n != 1 {
		t.Fatalf("%d ledger rows", n)
	}
}

// child consumes orders until SIGTERM; with crash set it stops dead once
// its first booking committed, prints the crash line and waits to be
// killed.
func child(schema, topic string, crash bool) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEM_TEST_POSTGRES_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	cfg := amqp.NewDurableQueueConfig(os.Getenv("IDEM_TEST_AMQP_URL"))
	pub, err := amqp.NewPublisher(cfg, watermill.NopLogger{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sub, err := amqp.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	router, c, err := NewRouter(pool, schema, sub, pub, Options{Topics: Topics{Orders: topic}, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Store.Close()
	if crash {
		c.committed = func(msg *message.Message) {
			fmt.Println(crashLine + msg.UUID)
			select {} // until SIGKILL
		}
	}
	if err := router.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

type proc struct {
	cmd   *exec.Cmd
	lines chan string
}

func startConsumer(t *testing.T, f *fixture, crash bool) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	mode := ""
	if crash {
		mode = "committed"
	}
	cmd.Env = append(os.Environ(), childEnv+"="+f.schema+" "+f.topics.Orders, crashEnv+"="+mode)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, lines: make(chan string, 16)}
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			p.lines <- s.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
	})
	return p
}

func (p *proc) waitLine(t *testing.T, want string) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				t.Fatalf("the consumer exited before printing %q", want)
			}
			if line == want {
				return
			}
		case <-timeout:
			t.Fatalf("the consumer did not print %q within a minute", want)
		}
	}
}

func (p *proc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
}

func deleteQueues(url string, queues ...string) {
	conn, err := amqp091.Dial(url)
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	for _, q := range queues {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
}

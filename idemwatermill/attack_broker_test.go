package idemwatermill_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemwatermill"
	"github.com/idem-dev/idem/internal/testenv"
)

// Attacks through RabbitMQ: messages that a producer other than Watermill
// published straight to the queue (no UUID, a UUID with control bytes, a
// UUID too long to be a key), a huge payload, and the same UUID
// with another payload. The refused ones land in the poison queue without
// running the handler; the huge one runs once, and its redelivery emits
// the same receipt.
func TestAMQPAttacks(t *testing.T) {
	t.Parallel()
	url := testenv.Getenv(t, "IDEM_TEST_AMQP_URL")
	e, _ := memEngine(t, idem.EngineConfig{MaxResponseBody: 16 << 20})
	var runs atomic.Int32
	h := func(m *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("receipt"))}, nil
	}
	rig := amqpRouter(t, func(pub message.Publisher, in string) []message.HandlerMiddleware {
		poison, err := middleware.PoisonQueueWithFilter(pub, in+"_poison", idemwatermill.IsPoison)
		if err != nil {
			t.Fatal(err)
		}
		return []message.HandlerMiddleware{poison, idemwatermill.Middleware(e, idemwatermill.Config{Scope: "billing"})}
	}, h)

	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	raw := func(body string, headers amqp091.Table) {
		t.Helper()
		if err := ch.PublishWithContext(context.Background(), "", rig.in, false, false, amqp091.Publishing{Headers: headers, Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name    string
		headers amqp091.Table
	}{
		{"no UUID", nil},
		{"control bytes", amqp091.Table{"_watermill_message_uuid": "k\r\nX-Evil: 1"}},
		{"too long", amqp091.Table{"_watermill_message_uuid": strings.Repeat("k", 300)}},
	} {
		raw("order", tc.headers)
		if err := rig.next(t); err != nil {
			t.Fatalf("%s: %v; want the poison queue to take it", tc.name, err)
		}
	}
	if n := runs.Load(); n != 0 {
		t.Fatalf("the handler ran %d times for messages without a usable key", n)
	}
	big := message.NewMessage(watermill.NewUUID(), []byte(strings.Repeat("x", 4<<20)))
	receipts := rig.collect(t)
	for range 2 {
		rig.publish(t, big.Copy())
		if err := rig.next(t); err != nil {
			t.Fatal(err)
		}
	}
	other := big.Copy()
	other.Payload = append(other.Payload[:len(other.Payload)-1:len(other.Payload)-1], 'y')
	rig.publish(t, other)
	if err := rig.next(t); err != nil {
		t.Fatalf("another payload under the UUID: %v; want the poison queue to take it", err)
	}
	first, again := receipts(), receipts()
	if runs.Load() != 1 || first != again {
		t.Fatalf("%d runs, receipts %s and %s; want one run and one receipt twice", runs.Load(), first, again)
	}
	if n := rig.count(t, rig.in+"_poison", 4); n != 4 {
		t.Fatalf("%d messages in the poison queue; want 4", n)
	}
}

// A router closed while its handler runs: the handler's context ends. A
// handler that says nothing happened (Retryable) has its key released, and
// the message, nacked, runs on the next consumer; the ledger sees it once.
func TestAMQPRouterClosedMidHandler(t *testing.T) {
	t.Parallel()
	e, _ := memEngine(t, idem.EngineConfig{})
	started := make(chan struct{})
	var runs, done atomic.Int32
	h := func(m *message.Message) ([]*message.Message, error) {
		if runs.Add(1) == 1 {
			close(started)
			<-m.Context().Done() // the first run waits for the router to close
			return nil, idem.Retryable(m.Context().Err())
		}
		done.Add(1)
		return nil, nil
	}
	mws := func(message.Publisher, string) []message.HandlerMiddleware {
		return []message.HandlerMiddleware{idemwatermill.Middleware(e, idemwatermill.Config{Scope: "billing", NackDelay: -1})}
	}
	first := amqpRouter(t, mws, h)
	first.publish(t, message.NewMessage(watermill.NewUUID(), []byte("order")))
	<-started
	if err := first.router.Close(); err != nil {
		t.Fatal(err)
	}
	if err := first.next(t); !errors.Is(err, context.Canceled) {
		t.Fatalf("the closed router's delivery: %v", err)
	}
	second := amqpRouterOn(t, first.in, first.out, mws, h)
	if err := second.next(t); err != nil {
		t.Fatal(err)
	}
	if n := done.Load(); n != 1 {
		t.Fatalf("the work was done %d times", n)
	}
}

// collect returns a function that waits for the next message on the rig's
// output topic and returns its UUID.
func (r *routerRig) collect(t *testing.T) func() string {
	t.Helper()
	msgs, err := r.sub.Subscribe(context.Background(), r.out)
	if err != nil {
		t.Fatal(err)
	}
	return func() string {
		select {
		case m := <-msgs:
			m.Ack()
			return m.UUID
		case <-time.After(time.Minute):
			t.Fatal("nothing emitted within a minute")
			return ""
		}
	}
}

// count waits, a minute at most, until the queue topic holds want
// messages (RabbitMQ counts a publication in its own time), and returns
// how many it holds.
func (r *routerRig) count(t *testing.T, topic string, want int) int {
	t.Helper()
	conn, err := amqp091.Dial(testenv.Getenv(t, "IDEM_TEST_AMQP_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		q, err := ch.QueueDeclarePassive(topic, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages >= want || time.Now().After(deadline) {
			return q.Messages
		}
		time.Sleep(50 * time.Millisecond) // polling the broker, not synchronising
	}
}

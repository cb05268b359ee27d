package idemwatermill_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemwatermill"
	"github.com/idem-dev/idem/internal/msgchaos"
	"github.com/idem-dev/idem/internal/testenv"
)

// The default key is the message's UUID, which must be the same on every
// delivery. Through watermill-amqp (the _watermill_message_uuid header) and
// watermill-sql (the uuid column) it is: a message nacked once comes back
// with its UUID, its payload and its metadata (plus watermill-amqp's
// redelivery flag, which the fingerprint ignores), and through the
// middleware the redelivery runs the handler that failed with Retryable.
func TestUUIDSurvivesRedelivery(t *testing.T) {
	t.Parallel()
	for _, broker := range []string{"amqp", "sql"} {
		t.Run(broker, func(t *testing.T) {
			t.Parallel()
			var pub message.Publisher
			var sub message.Subscriber
			topic := msgchaos.RandomName("uuid_")
			switch broker {
			case "amqp":
				url := testenv.Getenv(t, "IDEM_TEST_AMQP_URL")
				cfg := amqp.NewDurableQueueConfig(url)
				p, err := amqp.NewPublisher(cfg, watermill.NopLogger{})
				if err != nil {
					t.Fatal(err)
				}
				s, err := amqp.NewSubscriber(cfg, watermill.NopLogger{})
				if err != nil {
					t.Fatal(err)
				}
				pub, sub = p, s
				t.Cleanup(func() { deleteQueues(t, url, topic) })
			case "sql":
				db := msgchaos.NewDB(t)
				pool := searchPathPool(t, db.URL, db.Schema)
				p, err := wsql.NewPublisher(wsql.BeginnerFromPgx(pool), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, AutoInitializeSchema: true}, watermill.NopLogger{})
				if err != nil {
					t.Fatal(err)
				}
				s, err := newSQLSubscriber(pool)
				if err != nil {
					t.Fatal(err)
				}
				pub, sub = p, s
			}
			t.Cleanup(func() { pub.Close(); sub.Close() })
			e, _ := memEngine(t, idem.EngineConfig{})
			deliveries := make(chan *message.Message, 4)
			h := protect(t, e, idemwatermill.Config{Scope: "billing", NackDelay: -1}, func(msg *message.Message) ([]*message.Message, error) {
				deliveries <- msg.Copy()
				if len(deliveries) == 1 {
					return nil, idem.Retryable(errors.New("not yet"))
				}
				return nil, nil
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			msgs, err := sub.Subscribe(ctx, topic)
			if err != nil {
				t.Fatal(err)
			}
			sent := message.NewMessage(watermill.NewUUID(), []byte(`{"order":42}`))
			sent.Metadata.Set("tenant", "t-1")
			if err := pub.Publish(topic, sent); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				select {
				case m := <-msgs:
					if _, err := h(m); err != nil {
						m.Nack()
					} else {
						m.Ack()
					}
				case <-time.After(time.Minute):
					t.Fatal("no delivery within a minute")
				}
			}
			first, again := <-deliveries, <-deliveries
			for _, d := range []*message.Message{first, again} {
				if d.UUID != sent.UUID || string(d.Payload) != string(sent.Payload) || d.Metadata.Get("tenant") != "t-1" {
					t.Fatalf("delivered %s %q %v; sent %s %q %v", d.UUID, d.Payload, d.Metadata, sent.UUID, sent.Payload, sent.Metadata)
				}
			}
			if broker == "amqp" && !amqp.IsMessageRedelivered(again) {
				t.Errorf("the second delivery is not marked redelivered: %v", again.Metadata)
			}
		})
	}
}

package idemnats_test

import (
	"context"
	"log"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemnats"
)

// A durable JetStream consumer whose handler runs once per order, however
// often JetStream delivers it, and whose receipt is published with the same
// Nats-Msg-Id on every delivery. (It needs a NATS server with JetStream and
// a stream ORDERS with a consumer "billing"; a service shares a SQL or
// Redis store between its instances rather than memory.)
func ExampleGuard_MessageHandler() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	cons, err := js.Consumer(ctx, "ORDERS", "billing")
	if err != nil {
		log.Fatal(err)
	}
	store := idemmem.MustNew(idemmem.Config{})
	defer store.Close()
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}
	guard, err := idemnats.New(engine, idemnats.Config{Publisher: js})
	if err != nil {
		log.Fatal(err)
	}
	cc, err := cons.Consume(guard.MessageHandler(ctx, func(ctx context.Context, msg jetstream.Msg) ([]*nats.Msg, error) {
		// Book the order here: once per Nats-Msg-Id (or stream sequence).
		receipt := nats.NewMsg("receipts")
		receipt.Data = []byte("booked")
		return []*nats.Msg{receipt}, nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Stop()
	<-ctx.Done()
}

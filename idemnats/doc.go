// Package idemnats makes JetStream consumers written with nats.go's
// jetstream API run each message's handler once, however often JetStream
// delivers it: a message delivered again after its handler succeeded (the
// consumer died before acking, the ack was lost, AckWait ran out) is acked
// without running the handler, and the messages the first run published are
// published again with the same Nats-Msg-Id headers.
//
// Start with New over an idem.Engine, and turn a HandlerFunc into a
// jetstream.MessageHandler for cons.Consume:
//
//	guard, err := idemnats.New(engine, idemnats.Config{Publisher: js})
//	...
//	cc, err := cons.Consume(guard.MessageHandler(ctx, func(ctx context.Context, msg jetstream.Msg) ([]*nats.Msg, error) {
//		// do the work once; return the messages to publish
//	}))
//
// Each message is keyed by its Nats-Msg-Id header when it has one, or else
// by its place in the stream (StreamSequenceKey: the stream, the stream
// sequence and the time it was stored, which stay the same across
// redeliveries; Config.Key chooses otherwise), under the stream's name as
// the operation and the consumer's name as the scope. The outcomes map to
// JetStream's acknowledgements:
//
//   - a new key runs the handler under a lease, renewed with heartbeats,
//     each of which also tells JetStream the message is in progress
//     (InProgress); its produced messages are stored as the answer and
//     published, and the message is acked;
//   - a completed key: the stored messages are published again (JetStream
//     and downstream consumers drop them by Nats-Msg-Id), and the message
//     is acked without running the handler;
//   - a key still held by a running handler: NakWithDelay, so the message
//     comes back later;
//   - a key in review, used with another payload, or a message without a
//     usable key: Term, with the reason (see Config.Publisher);
//   - a handler error: Nak when the key was released (idem.Retryable, or a
//     plain error of a Transactional operation; NakWithDelay, backing off,
//     when it failed on an earlier delivery too), Term when it
//     went to review (idem.Ambiguous, or a plain error of an External
//     operation).
//
// JetStream's own duplicate window (Nats-Msg-Id on publish) keeps a
// message from being stored twice when its publisher retries; it does
// nothing for a message that is stored once and processed twice. That is
// this package's job. docs/messages.md compares the two.
package idemnats

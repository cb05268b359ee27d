package idemwatermill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idem-dev/idem"
)

// A message's answer is what its handler produced: the messages, with their
// UUIDs, metadata and payloads, stored as JSON so that a redelivery emits
// them again unchanged.

// answerType is the stored answer's Content-Type.
const answerType = "application/vnd.idem.watermill-messages+json"

type storedMessage struct {
	UUID     string            `json:"uuid"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Payload  []byte            `json:"payload,omitempty"`
	// Raw holds the UUID and the metadata instead, as bytes, when one of
	// them is not valid UTF-8, which a JSON string would not keep: the
	// UUID first, then each name and value.
	Raw [][]byte `json:"raw,omitempty"`
}

// store returns m as it is stored.
func store(m *message.Message) storedMessage {
	s := storedMessage{UUID: m.UUID, Metadata: m.Metadata, Payload: m.Payload}
	valid := utf8.ValidString(m.UUID)
	for k, v := range m.Metadata {
		valid = valid && utf8.ValidString(k) && utf8.ValidString(v)
	}
	if valid {
		return s
	}
	s.UUID, s.Metadata = "", nil
	s.Raw = append(s.Raw, []byte(m.UUID))
	for k, v := range m.Metadata {
		s.Raw = append(s.Raw, []byte(k), []byte(v))
	}
	return s
}

// load returns the message s stores.
func (s storedMessage) load() (*message.Message, error) {
	if s.Raw == nil {
		m := message.NewMessage(s.UUID, s.Payload)
		for k, v := range s.Metadata {
			m.Metadata.Set(k, v)
		}
		return m, nil
	}
	if len(s.Raw)%2 != 1 {
		return nil, errors.New("a stored message's raw metadata is not in pairs")
	}
	m := message.NewMessage(string(s.Raw[0]), s.Payload)
	for i := 1; i < len(s.Raw); i += 2 {
		m.Metadata.Set(string(s.Raw[i]), string(s.Raw[i+1]))
	}
	return m, nil
}

type storedAnswer struct {
	Messages []storedMessage `json:"messages"`
}

// Answer returns the stored answer of a handler that produced msgs, to
// pass to a store's CompleteTx (CompleteTx does this for you). Each
// produced message is copied, its metadata included, and a copy without a
// UUID is given one, so that every delivery emits it under the same UUID;
// the caller's messages, and metadata maps they share, are left as they
// were (a template message reused by every run no longer carries the first
// run's UUID into the others). Two produced messages with one UUID are
// refused (ErrDuplicateUUID): a consumer that dedupes by UUID would drop
// the second.
func Answer(msgs []*message.Message) (*idem.Response, error) {
	resp, _, err := encodeAnswer(msgs)
	return resp, err
}

// ErrDuplicateUUID is returned (wrapped) when a handler produced two
// messages with one UUID.
var ErrDuplicateUUID = errors.New("idemwatermill: two produced messages share one UUID, and a consumer that dedupes by UUID keeps only the first")

// encodeAnswer returns the stored answer of msgs, and the copies of msgs it
// holds, each with its UUID and its original's context.
func encodeAnswer(msgs []*message.Message) (*idem.Response, []*message.Message, error) {
	a := storedAnswer{Messages: make([]storedMessage, 0, len(msgs))}
	out := make([]*message.Message, 0, len(msgs))
	uuids := make(map[string]int, len(msgs))
	for i, m := range msgs {
		if m == nil {
			return nil, nil, errors.New("idemwatermill: the handler produced a nil message")
		}
		c := m.Copy()
		c.SetContext(m.Context())
		if c.UUID == "" {
			c.UUID = watermill.NewUUID()
		}
		if j, ok := uuids[c.UUID]; ok {
			return nil, nil, fmt.Errorf("%w: produced messages %d and %d; give each its own UUID, or none and idem gives each one", ErrDuplicateUUID, j+1, i+1)
		}
		uuids[c.UUID] = i
		out = append(out, c)
		a.Messages = append(a.Messages, store(c))
	}
	b, err := json.Marshal(a)
	if err != nil {
		return nil, nil, fmt.Errorf("idemwatermill: encoding the produced messages: %w", err)
	}
	return &idem.Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {answerType}}, Body: b}, out, nil
}

// decodeAnswer returns the messages of a stored answer. An empty answer
// (an operator completed the key without one) holds none.
func decodeAnswer(resp *idem.Response) ([]*message.Message, error) {
	if len(resp.Body) == 0 {
		return nil, nil
	}
	var a storedAnswer
	if err := json.Unmarshal(resp.Body, &a); err != nil {
		return nil, fmt.Errorf("the stored answer is not a handler's messages: %w", err)
	}
	out := make([]*message.Message, 0, len(a.Messages))
	for _, s := range a.Messages {
		m, err := s.load()
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// ErrNoLease is returned by CompleteTx when the context carries no lease:
// the message is not being handled under the middleware.
var ErrNoLease = errors.New("idemwatermill: the context carries no lease; is the handler behind the middleware?")

// CompleteTx stores produced as the answer of the message being handled,
// inside tx, the handler's own transaction in the idem store's database,
// so that the handler's change and idem's record commit together or not
// at all. ctx is the message's context (msg.Context()), which carries its
// lease; store is the engine's store (*idempg.Store with pgx.Tx,
// *idemsqlite.Store or *idemmysql.Store with *sql.Tx). The handler then
// returns the same produced messages; if it returns others, the middleware
// logs it and returns the stored ones, which every redelivery emits.
//
// With watermill-sql, publish the produced messages to an outbox in tx
// too (sql.NewPublisher(sql.TxFromPgx(tx), …)) and return none: the
// business change, the published messages and idem's record then commit
// in one transaction.
func CompleteTx[Tx any](ctx context.Context, store idem.TxCompleter[Tx], tx Tx, produced ...*message.Message) error {
	lease := idem.LeaseFrom(ctx)
	if lease == nil {
		return ErrNoLease
	}
	resp, err := Answer(produced)
	if err != nil {
		return err
	}
	return store.CompleteTx(ctx, tx, lease, resp)
}

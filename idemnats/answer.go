package idemnats

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/idem-dev/idem"
)

// A message's answer is what its handler produced: the messages to publish,
// each with its subject, headers (a Nats-Msg-Id among them) and data, kept
// byte for byte so that a redelivery publishes them again unchanged. The
// encoding is a version byte, then a count and, per message, its subject,
// its headers and its data, each length-prefixed (uvarint).

const (
	answerType    = "application/vnd.idem.nats-messages"
	answerVersion = 1
)

// Answer returns the stored answer of a handler that produced msgs, to
// pass to a store's CompleteTx (CompleteTx does this for you). Each
// produced message is copied, its headers included, and a copy without a
// Nats-Msg-Id header is given one, so that every delivery publishes it
// under the same ID; the caller's messages, and header maps they share
// (one nats.Header for several messages, a template's), are left as they
// were. Two produced messages with one Nats-Msg-Id and one subject are
// refused (ErrDuplicateID): JetStream would store only the first. (One ID
// on two subjects is allowed: an event published to two streams. Two
// subjects of one stream share its duplicate window, and the second is
// dropped at its first publication, which the guard reports.)
func Answer(msgs []*nats.Msg) (*idem.Response, error) {
	resp, _, err := encodeAnswer(msgs)
	return resp, err
}

// ErrDuplicateID is returned (wrapped) when a handler produced two
// messages with one Nats-Msg-Id and one subject, and when JetStream dropped a produced
// message as a duplicate at its first publication: a message of the
// answer would be lost.
var ErrDuplicateID = errors.New("idemnats: two produced messages share one Nats-Msg-Id, and JetStream keeps only the first")

// encodeAnswer returns the stored answer of msgs, and the copies of msgs
// it holds, each with its Nats-Msg-Id.
func encodeAnswer(msgs []*nats.Msg) (*idem.Response, []*nats.Msg, error) {
	b := []byte{answerVersion}
	b = binary.AppendUvarint(b, uint64(len(msgs)))
	out := make([]*nats.Msg, 0, len(msgs))
	ids := make(map[string]int, len(msgs))
	for i, m := range msgs {
		if m == nil {
			return nil, nil, errors.New("idemnats: the handler produced a nil message")
		}
		if m.Subject == "" {
			return nil, nil, errors.New("idemnats: the handler produced a message without a subject")
		}
		c := &nats.Msg{Subject: m.Subject, Header: cloneHeader(m.Header), Data: m.Data}
		if c.Header.Get(jetstream.MsgIDHeader) == "" {
			c.Header.Set(jetstream.MsgIDHeader, nuid.Next())
		}
		id := c.Subject + "\x00" + c.Header.Get(jetstream.MsgIDHeader)
		if j, ok := ids[id]; ok {
			return nil, nil, fmt.Errorf("%w: produced messages %d and %d (subject %q); give each its own, or none and idem gives each one", ErrDuplicateID, j+1, i+1, c.Subject)
		}
		ids[id] = i
		out = append(out, c)
		b = appendBytes(b, c.Subject)
		names := make([]string, 0, len(c.Header))
		for name := range c.Header {
			names = append(names, name)
		}
		slices.Sort(names)
		b = binary.AppendUvarint(b, uint64(len(names)))
		for _, name := range names {
			b = appendBytes(b, name)
			vs := c.Header[name]
			b = binary.AppendUvarint(b, uint64(len(vs)))
			for _, v := range vs {
				b = appendBytes(b, v)
			}
		}
		b = appendBytes(b, c.Data)
	}
	return &idem.Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {answerType}}, Body: b}, out, nil
}

// cloneHeader is a deep copy of h, never nil.
func cloneHeader(h nats.Header) nats.Header {
	c := make(nats.Header, len(h)+1)
	for name, vs := range h {
		c[name] = slices.Clone(vs)
	}
	return c
}

func appendBytes[S string | []byte](b []byte, s S) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

var errCorrupt = errors.New("the stored answer is not a handler's messages")

// decodeAnswer returns the messages of a stored answer. An empty answer
// (an operator completed the key without one) holds none.
func decodeAnswer(body []byte) ([]*nats.Msg, error) {
	if len(body) == 0 {
		return nil, nil
	}
	if body[0] != answerVersion {
		return nil, errCorrupt
	}
	d := decoder{b: body[1:]}
	n := d.count()
	out := make([]*nats.Msg, 0, min(n, 1024))
	for i := uint64(0); i < n && d.err == nil; i++ {
		m := &nats.Msg{Subject: string(d.bytes())}
		if nh := d.count(); nh > 0 {
			m.Header = make(nats.Header, min(nh, 64))
			for j := uint64(0); j < nh && d.err == nil; j++ {
				name := string(d.bytes())
				nv := d.count()
				for k := uint64(0); k < nv && d.err == nil; k++ {
					m.Header[name] = append(m.Header[name], string(d.bytes()))
				}
			}
		}
		m.Data = d.bytes()
		out = append(out, m)
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, errCorrupt
	}
	return out, nil
}

type decoder struct {
	b   []byte
	err error
}

// count reads a count, which can be no larger than the bytes left.
func (d *decoder) count() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > uint64(len(d.b)) {
		d.err = errCorrupt
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	l := d.count()
	if d.err != nil || l > uint64(len(d.b)) {
		d.err = errCorrupt
		return nil
	}
	v := d.b[:l:l]
	d.b = d.b[l:]
	return v
}

package rpccore

import (
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idem-dev/idem"
)

// The fingerprint of a call is idem.Fingerprint of its operation and of
// its request message in protobuf's deterministic encoding (map entries in
// key order), so that a retry that encodes a map in another order is the
// same request, whatever protocol or codec (binary or JSON) carried it:
//
//   - the key field (request_id, or idempotency_key with its first_sent)
//     is left out, so that the key never makes two attempts differ. An
//     AEP-155 first_sent says how old the key is, not what is asked: a
//     client that restarts and sends the operation again under its key
//     stamps another first_sent, and must get the first answer, not
//     KEY_REUSED (which would tell it to use a new key and run the
//     operation twice). first_sent serves only to refuse keys older than
//     the server keeps them (checkFirstSent);
//   - unknown fields, at any depth, are left out: the server did not read
//     them, so they cannot have changed what it did. A newer client whose
//     retry differs only in fields this server does not know gets the
//     first answer, as it would from a server that ignored them.
var fpBufs = sync.Pool{New: func() any { return new([]byte) }}

// fpContentType tags the fingerprint's body: a message, not JSON.
const fpContentType = "application/protobuf"

// Fingerprint returns the fingerprint of m, a request of op, under key
// (FingerprintOptions.Key; nil for plain SHA-256), and what it was made of,
// which lets a record fingerprinted by an earlier version of idem match a
// retry (idem.Request.FingerprintSource). With buf, the encoding is made in
// *buf, and what it was made of holds it: the caller keeps *buf untouched
// while it uses that (in Begin), and may reuse it after; nil makes a new
// one.
func Fingerprint(op string, m proto.Message, f *KeyFields, k found, key []byte, buf *[]byte) (string, *idem.FingerprintSource, error) {
	if r := m.ProtoReflect(); len(r.GetUnknown()) > 0 || f.nested && hasUnknown(r) {
		m = proto.Clone(m)
		discardUnknown(m.ProtoReflect())
	}
	if buf == nil {
		buf = new([]byte)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend((*buf)[:0], m)
	if err != nil {
		return "", nil, err
	}
	*buf = b
	b = dropFields(b, f)
	src := &idem.FingerprintSource{Input: idem.FingerprintInput{Method: "RPC", Operation: op, ContentType: fpContentType, Body: b},
		Options: idem.FingerprintOptions{Key: key}}
	fp, err := idem.Fingerprint(src.Input, src.Options)
	return fp, src, err
}

// withFirstSent returns the fingerprint that earlier versions of idem gave
// a call whose request src is, sent with an AEP-155 first_sent of at: they
// counted it. A retry that a server before the upgrade reserved, sent
// again with its first_sent unchanged, matches its record by it.
func withFirstSent(src *idem.FingerprintSource, at time.Time) (string, error) {
	in := src.Input
	in.Query = "first_sent=" + strconv.FormatInt(at.UnixNano(), 10)
	return idem.Fingerprint(in, src.Options)
}

// fpBuffer returns a buffer for Fingerprint from the pool; putFPBuffer
// gives it back.
func fpBuffer() *[]byte { return fpBufs.Get().(*[]byte) }

func putFPBuffer(bp *[]byte) {
	if cap(*bp) <= 1<<20 { // do not pin huge buffers in the pool
		fpBufs.Put(bp)
	}
}

// dropFields removes the top-level key fields from b, a message's
// encoding, in place.
func dropFields(b []byte, f *KeyFields) []byte {
	var skip [2]protowire.Number
	n := 0
	if f.RequestID != nil {
		skip[n] = f.RequestID.Number()
		n++
	}
	if f.IdemKey != nil {
		skip[n] = f.IdemKey.Number()
		n++
	}
	if n == 0 {
		return b
	}
	out := b[:0]
	for rest := b; len(rest) > 0; {
		num, typ, tagLen := protowire.ConsumeTag(rest)
		if tagLen < 0 {
			return b // not reached: the encoding is the marshaller's own
		}
		size := protowire.ConsumeFieldValue(num, typ, rest[tagLen:])
		if size < 0 {
			return b
		}
		field := rest[:tagLen+size]
		rest = rest[tagLen+size:]
		if num != skip[0] && (n < 2 || num != skip[1]) {
			out = append(out, field...) // out never overtakes rest: a copy within b
		}
	}
	return out
}

// hasUnknown reports whether m, or a message in it, has unknown fields.
func hasUnknown(m protoreflect.Message) bool {
	if len(m.GetUnknown()) > 0 {
		return true
	}
	found := false
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		found = anyUnknown(fd, v, hasUnknown)
		return !found
	})
	return found
}

// discardUnknown removes the unknown fields of m and of the messages in it.
func discardUnknown(m protoreflect.Message) {
	if len(m.GetUnknown()) > 0 {
		m.SetUnknown(nil)
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		anyUnknown(fd, v, func(m protoreflect.Message) bool { discardUnknown(m); return false })
		return true
	})
}

// anyUnknown applies f to the messages in field fd's value v, until f
// reports true.
func anyUnknown(fd protoreflect.FieldDescriptor, v protoreflect.Value, f func(protoreflect.Message) bool) bool {
	switch {
	case fd.IsMap():
		if fd.MapValue().Message() == nil {
			return false
		}
		found := false
		v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
			found = f(mv.Message())
			return !found
		})
		return found
	case fd.Message() == nil:
		return false
	case fd.IsList():
		l := v.List()
		for i := 0; i < l.Len(); i++ {
			if f(l.Get(i).Message()) {
				return true
			}
		}
		return false
	}
	return f(v.Message())
}

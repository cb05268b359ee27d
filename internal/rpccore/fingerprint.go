package rpccore

import (
	"strconv"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

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
//     first answer, as it would from a server that ignored them;
//   - a google.protobuf.Any whose type the server resolves (Options.Types)
//     counts by the message it holds, canonicalised as the request is (its
//     maps in key order, its unknown fields left out, the Anys inside it
//     likewise, to maxAnyDepth), under its type's full name: a client's
//     encoder, or protobuf JSON, may write an Any's bytes in any order.
//     An Any whose type the server cannot resolve, or that does not
//     decode, or nested deeper than maxAnyDepth, counts by its type URL
//     and bytes as they came.
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
func Fingerprint(op string, m proto.Message, f *KeyFields, k found, key []byte, types *protoregistry.Types, buf *[]byte) (string, *idem.FingerprintSource, error) {
	switch r := m.ProtoReflect(); {
	case f.anys:
		// Deterministic marshalling does not re-encode the bytes inside an
		// Any: they are canonicalised here, on a copy.
		if types == nil {
			types = protoregistry.GlobalTypes
		}
		m = proto.Clone(m)
		canonical(m.ProtoReflect(), types, 0)
	case len(r.GetUnknown()) > 0 || f.nested && hasUnknown(r):
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

// earlierFingerprint returns the fingerprint that earlier versions of idem
// gave the call, and whether it differs from today's: they counted an
// AEP-155 first_sent, and an Any by its bytes as they came. A retry that a
// server before the upgrade reserved, sent again as it was (first_sent
// unchanged), matches its record by it, instead of getting KEY_REUSED,
// which would tell its client to run the operation again under a new key.
func earlierFingerprint(op string, m proto.Message, f *KeyFields, k found, key []byte) (string, bool, error) {
	if !k.hasFirstSent && !f.anys {
		return "", false, nil
	}
	if r := m.ProtoReflect(); len(r.GetUnknown()) > 0 || f.nested && hasUnknown(r) {
		m = proto.Clone(m)
		discardUnknown(m.ProtoReflect())
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return "", false, err
	}
	in := idem.FingerprintInput{Method: "RPC", Operation: op, ContentType: fpContentType, Body: dropFields(b, f)}
	if k.hasFirstSent {
		in.Query = "first_sent=" + strconv.FormatInt(k.firstSent.UnixNano(), 10)
	}
	fp, err := idem.Fingerprint(in, idem.FingerprintOptions{Key: key})
	return fp, err == nil, err
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

// maxAnyDepth bounds how deep Anys inside Anys are unpacked to be
// canonicalised; deeper ones count by their bytes. Each level decodes its
// bytes once more, so the bound keeps hostile nesting from costing more
// than a few passes over the request.
const maxAnyDepth = 8

// anyName is the full name of google.protobuf.Any.
const anyName protoreflect.FullName = "google.protobuf.Any"

// canonical makes m, and every message in it, canonical for the
// fingerprint: unknown fields removed, and each Any of a type that types
// resolves holding its message in canonical, deterministic form, under the
// type's full name. depth is how many Anys m is inside.
func canonical(m protoreflect.Message, types *protoregistry.Types, depth int) {
	if len(m.GetUnknown()) > 0 {
		m.SetUnknown(nil)
	}
	if m.Descriptor().FullName() == anyName {
		canonicalAny(m, types, depth)
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		anyUnknown(fd, v, func(sub protoreflect.Message) bool { canonical(sub, types, depth); return false })
		return true
	})
}

// canonicalAny makes the Any m canonical, when its type resolves.
func canonicalAny(m protoreflect.Message, types *protoregistry.Types, depth int) {
	if depth >= maxAnyDepth {
		return
	}
	fields := m.Descriptor().Fields()
	urlField, valueField := fields.ByNumber(1), fields.ByNumber(2)
	if urlField == nil || valueField == nil {
		return
	}
	mt, err := types.FindMessageByURL(m.Get(urlField).String())
	if err != nil {
		return // a type the server does not know: by its bytes
	}
	inner := mt.New()
	if err := (proto.UnmarshalOptions{Resolver: types, DiscardUnknown: true, AllowPartial: true}).Unmarshal(m.Get(valueField).Bytes(), inner.Interface()); err != nil {
		return
	}
	canonical(inner, types, depth+1)
	b, err := proto.MarshalOptions{Deterministic: true, AllowPartial: true}.Marshal(inner.Interface())
	if err != nil {
		return
	}
	m.Set(urlField, protoreflect.ValueOfString(anyURLPrefix+string(mt.Descriptor().FullName())))
	m.Set(valueField, protoreflect.ValueOfBytes(b))
}

// anyURLPrefix is the prefix of a canonical Any's type URL.
const anyURLPrefix = "type.googleapis.com/"

// reachesAny reports whether a message described by md can hold a
// google.protobuf.Any, at any depth.
func reachesAny(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if md.FullName() == anyName {
		return true
	}
	if seen[md.FullName()] {
		return false
	}
	seen[md.FullName()] = true
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		sub := fd.Message()
		if fd.IsMap() {
			sub = fd.MapValue().Message()
		}
		if sub != nil && reachesAny(sub, seen) {
			return true
		}
	}
	return false
}

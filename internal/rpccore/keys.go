package rpccore

import (
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idem-dev/idem"
)

// MetadataKey is the metadata (header) that carries a call's key.
const MetadataKey = "idempotency-key"

// The field names of the key sources in a request message.
const (
	fieldRequestID      = "request_id"      // AIP-155: a string, a UUID
	fieldIdempotencyKey = "idempotency_key" // AEP-155: aep.api.IdempotencyKey, or a string
	fieldKey            = "key"
	fieldFirstSent      = "first_sent"
	timestampName       = "google.protobuf.Timestamp"
)

// KeyFields is where a request message carries its key, if anywhere.
type KeyFields struct {
	// RequestID is a top-level string request_id (AIP-155).
	RequestID protoreflect.FieldDescriptor
	// IdemKey is a top-level idempotency_key: a message with a string key
	// and a Timestamp first_sent (AEP-155), or a string.
	IdemKey protoreflect.FieldDescriptor
	// Key and FirstSent are the fields of IdemKey's message.
	Key, FirstSent protoreflect.FieldDescriptor

	// nested reports whether the message has a field that holds messages
	// (a message, a list of them, a map to them): only then can unknown
	// fields hide below the top level.
	nested bool
	// anys reports whether the message can hold a google.protobuf.Any, at
	// any depth: only then is it canonicalised beyond deterministic
	// marshalling.
	anys bool
}

// Any reports whether the message has a key field.
func (f *KeyFields) Any() bool { return f.RequestID != nil || f.IdemKey != nil }

// Name is the field a client should set, for messages about a key.
func (f *KeyFields) Name() string {
	switch {
	case f.IdemKey != nil && f.Key != nil:
		return fieldIdempotencyKey + "." + fieldKey
	case f.IdemKey != nil:
		return fieldIdempotencyKey
	case f.RequestID != nil:
		return fieldRequestID
	}
	return MetadataKey
}

var keyFieldsCache sync.Map // protoreflect.MessageDescriptor → *KeyFields

// KeyFieldsOf returns the key fields of messages described by md.
func KeyFieldsOf(md protoreflect.MessageDescriptor) *KeyFields {
	if f, ok := keyFieldsCache.Load(md); ok {
		return f.(*KeyFields)
	}
	f := new(KeyFields)
	fields := md.Fields()
	if fd := fields.ByName(fieldRequestID); fd != nil && fd.Kind() == protoreflect.StringKind && !fd.IsList() {
		f.RequestID = fd
	}
	if fd := fields.ByName(fieldIdempotencyKey); fd != nil && !fd.IsList() && !fd.IsMap() {
		switch fd.Kind() {
		case protoreflect.StringKind:
			f.IdemKey = fd
		case protoreflect.MessageKind:
			sub := fd.Message().Fields()
			k, fs := sub.ByName(fieldKey), sub.ByName(fieldFirstSent)
			if k != nil && k.Kind() == protoreflect.StringKind && !k.IsList() {
				f.IdemKey, f.Key = fd, k
				if fs != nil && fs.Kind() == protoreflect.MessageKind && !fs.IsList() && fs.Message().FullName() == timestampName {
					f.FirstSent = fs
				}
			}
		}
	}
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if fd.Message() != nil && (!fd.IsMap() || fd.MapValue().Message() != nil) {
			f.nested = true
		}
	}
	f.anys = reachesAny(md, map[protoreflect.FullName]bool{})
	keyFieldsCache.Store(md, f)
	return f
}

// found is a call's key and where it came from.
type found struct {
	key   string
	field string // where the key was read: a field path, or the metadata name
	// firstSent is the AEP-155 first_sent, when the key came with one.
	firstSent    time.Time
	hasFirstSent bool
}

// keyError is a key refused: missing, or invalid, with the field at fault.
type keyError struct {
	missing bool
	field   string
	reason  string
}

// findKey reads the call's key from its metadata values and its message's
// key fields. Every source present must give the same key. A key that is
// absent everywhere is a *keyError with missing set.
func findKey(values []string, m protoreflect.Message, f *KeyFields, anyRequestID bool) (found, *keyError) {
	var sources [3]found // metadata, request_id, idempotency_key
	got := sources[:0]
	if len(values) > 0 {
		k, err := idem.ParseKeyHeader(values)
		if err != nil {
			return found{}, &keyError{field: MetadataKey, reason: reasonOf(err, "the "+MetadataKey+" metadata")}
		}
		got = append(got, found{key: canonicalKey(k), field: MetadataKey})
	}
	if f.RequestID != nil {
		if v := m.Get(f.RequestID).String(); v != "" {
			// One reading tells whether v is a UUID and its case. A UUID
			// is always a valid key; any other request_id must be one,
			// and is refused unless AnyRequestID.
			uuid, upper := uuidForm(v)
			if !uuid {
				if err := idem.ValidateKey(v); err != nil {
					return found{}, &keyError{field: fieldRequestID, reason: reasonOf(err, fieldRequestID)}
				}
				if !anyRequestID {
					return found{}, &keyError{field: fieldRequestID, reason: "request_id must be a UUID (8-4-4-4-12 hexadecimal digits, not all zero), as AIP-155 asks"}
				}
			} else if upper {
				v = lower(v)
			}
			got = append(got, found{key: v, field: fieldRequestID})
		}
	}
	if f.IdemKey != nil && m.Has(f.IdemKey) {
		fk, kerr := idemKey(m, f)
		if kerr != nil {
			return found{}, kerr
		}
		if fk.key != "" || f.Key != nil {
			fk.key = canonicalKey(fk.key)
			got = append(got, fk)
		}
	}
	if len(got) == 0 {
		return found{}, &keyError{missing: true, field: f.Name()}
	}
	for _, g := range got[1:] {
		if g.key != got[0].key {
			return found{}, &keyError{field: g.field, reason: fmt.Sprintf("the call carries two different keys, in %s and in %s; send one key, or the same in both", got[0].field, g.field)}
		}
	}
	k := got[0]
	for _, g := range got {
		if g.hasFirstSent {
			k.firstSent, k.hasFirstSent = g.firstSent, true
		}
	}
	return k, nil
}

// idemKey reads an idempotency_key field, present in m.
func idemKey(m protoreflect.Message, f *KeyFields) (found, *keyError) {
	if f.Key == nil { // a string idempotency_key
		v := m.Get(f.IdemKey).String()
		if err := idem.ValidateKey(v); err != nil {
			return found{}, &keyError{field: fieldIdempotencyKey, reason: reasonOf(err, fieldIdempotencyKey)}
		}
		return found{key: v, field: fieldIdempotencyKey}, nil
	}
	sub := m.Get(f.IdemKey).Message()
	name := fieldIdempotencyKey + "." + fieldKey
	v := sub.Get(f.Key).String()
	if err := idem.ValidateKey(v); err != nil {
		return found{}, &keyError{field: name, reason: reasonOf(err, name)}
	}
	k := found{key: v, field: name}
	if f.FirstSent != nil {
		fsName := fieldIdempotencyKey + "." + fieldFirstSent
		if !sub.Has(f.FirstSent) {
			return found{}, &keyError{field: fsName, reason: fsName + " is required with a key (AEP-155): the time the first attempt was sent"}
		}
		ts := sub.Get(f.FirstSent).Message()
		fields := ts.Descriptor().Fields()
		secs, nanos := ts.Get(fields.ByNumber(1)).Int(), ts.Get(fields.ByNumber(2)).Int()
		if nanos < 0 || nanos > 999_999_999 || secs < minTimestamp || secs > maxTimestamp {
			return found{}, &keyError{field: fsName, reason: fsName + " is not a valid timestamp"}
		}
		k.firstSent, k.hasFirstSent = time.Unix(secs, nanos).UTC(), true
	}
	return k, nil
}

// The range of google.protobuf.Timestamp: 0001-01-01 to 9999-12-31.
const (
	minTimestamp = -62135596800
	maxTimestamp = 253402300799
)

// checkFirstSent refuses a first_sent that is in the future (beyond skew)
// or older than the key is kept (retention), as AEP-155 asks.
//
// first_sent is read on the client's clock, and the key's record expires
// on the store's; either may be ahead of this server's by up to skew. A
// key is therefore expired skew before its retention ends on this
// server's clock: a client whose clock runs ahead would otherwise have
// its retry accepted after the store let the record go, and the call
// would run a second time. New makes sure retention exceeds skew.
func checkFirstSent(k found, now time.Time, retention, skew time.Duration) *keyError {
	if !k.hasFirstSent {
		return nil
	}
	name := fieldIdempotencyKey + "." + fieldFirstSent
	switch {
	case k.firstSent.After(now.Add(skew)):
		return &keyError{field: name, reason: fmt.Sprintf("%s %s is in the future", name, k.firstSent.Format(time.RFC3339Nano))}
	case k.firstSent.Before(now.Add(skew - retention)):
		return &keyError{field: name, reason: fmt.Sprintf("%s %s is older than the %v this server keeps keys (less %v for clock skew); the key has expired", name, k.firstSent.Format(time.RFC3339Nano), retention, skew)}
	}
	return nil
}

// checkSkew refuses a retention that the clock skew allowed for would use
// up: every first_sent would be expired.
func checkSkew(what string, retention, skew time.Duration) error {
	if retention <= skew {
		return fmt.Errorf("%s retention %v must be longer than MaxClockSkew %v: AEP-155 keys expire MaxClockSkew before their retention ends", what, retention, skew)
	}
	return nil
}

// SameKey reports whether a and b, each a key field's value or a metadata
// value, are one key as the server reads them: whitespace around a
// metadata value and an RFC 8941 string's quotes are not part of it, and a
// UUID's case does not matter. The client interceptors compare the keys a
// call carries with it.
func SameKey(a, b string) bool {
	norm := func(v string) string {
		if k, err := idem.ParseKeyHeader([]string{v}); err == nil {
			v = k
		}
		return canonicalKey(v)
	}
	return a == b || norm(a) == norm(b)
}

// canonicalKey is key, in lower case when it is a UUID: RFC 9562 has a
// UUID's hexadecimal digits case-insensitive, so a client (or a proxy)
// that writes the same request_id in another case must not run the call
// again. Any other key is compared byte for byte.
func canonicalKey(key string) string {
	if ok, upper := uuidForm(key); ok && upper {
		return lower(key)
	}
	return key
}

// reasonOf is a key error's reason, for the field named.
func reasonOf(err error, field string) string {
	if ke, ok := err.(*idem.KeyError); ok {
		return field + ": " + ke.Reason
	}
	return field + ": " + err.Error()
}

// uuidForm reports whether s is a UUID in its canonical text form (any
// version), not the nil UUID, as Google's APIs accept a request_id, and
// whether any of its hexadecimal digits is in upper case. It reads each
// byte once, through uuidDigit, without a branch per byte: both are asked
// of every request_id a call carries.
func uuidForm(s string) (ok, upper bool) {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return false, false
	}
	all, some := uint8(digitHex), uint8(0)
	for _, i := range uuidDigitAt {
		d := uuidDigit[s[i]]
		all &= d
		some |= d
	}
	return all&digitHex != 0 && some&digitNonZero != 0, some&digitUpper != 0
}

// What uuidDigit says of a byte.
const (
	digitHex     = 1 << iota // a hexadecimal digit
	digitNonZero             // other than '0'
	digitUpper               // 'A' to 'F'
)

// uuidDigit classifies every byte as a UUID's digit.
var uuidDigit = func() (t [256]uint8) {
	t['0'] = digitHex
	for c := '1'; c <= '9'; c++ {
		t[c] = digitHex | digitNonZero
	}
	for c := 'a'; c <= 'f'; c++ {
		t[c] = digitHex | digitNonZero
		t[c-'a'+'A'] = digitHex | digitNonZero | digitUpper
	}
	return t
}()

// uuidDigitAt are the places of a UUID's 32 digits in its text form.
var uuidDigitAt = func() (at [32]uint8) {
	j := 0
	for i := range 36 {
		if i != 8 && i != 13 && i != 18 && i != 23 {
			at[j] = uint8(i)
			j++
		}
	}
	return at
}()

// SetKey sets key in m's empty key field, for a client, and reports
// whether it did: request_id, or an idempotency_key with first_sent at now.
// m must be the client's own copy.
func SetKey(m proto.Message, f *KeyFields, key string, now time.Time) bool {
	r := m.ProtoReflect()
	switch {
	case f.IdemKey != nil && f.Key == nil:
		r.Set(f.IdemKey, protoreflect.ValueOfString(key))
	case f.IdemKey != nil:
		sub := r.Mutable(f.IdemKey).Message()
		sub.Set(f.Key, protoreflect.ValueOfString(key))
		if f.FirstSent != nil && !sub.Has(f.FirstSent) {
			ts := sub.Mutable(f.FirstSent).Message()
			fields := ts.Descriptor().Fields()
			ts.Set(fields.ByNumber(1), protoreflect.ValueOfInt64(now.Unix()))
			ts.Set(fields.ByNumber(2), protoreflect.ValueOfInt32(int32(now.Nanosecond())))
		}
	case f.RequestID != nil:
		r.Set(f.RequestID, protoreflect.ValueOfString(key))
	default:
		return false
	}
	return true
}

// NeedsFirstSent reports whether m has an AEP-155 idempotency_key whose
// first_sent is not set.
func NeedsFirstSent(m proto.Message, f *KeyFields) bool {
	if f.FirstSent == nil {
		return false
	}
	r := m.ProtoReflect()
	return r.Has(f.IdemKey) && !r.Get(f.IdemKey).Message().Has(f.FirstSent)
}

// KeyIn returns the key already in m's key fields, or "".
func KeyIn(m proto.Message, f *KeyFields) string {
	r := m.ProtoReflect()
	switch {
	case f.IdemKey != nil && f.Key == nil:
		return r.Get(f.IdemKey).String()
	case f.IdemKey != nil && r.Has(f.IdemKey):
		return r.Get(f.IdemKey).Message().Get(f.Key).String()
	case f.RequestID != nil:
		return r.Get(f.RequestID).String()
	}
	return ""
}

package idemclient

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"net/http"
	"strings"

	"github.com/google/uuid"

	"github.com/idem-dev/idem"
)

// NewKey returns a fresh random key: a UUIDv7, whose leading timestamp keeps
// keys made close together near each other in a store's index. It is
// Transport's default key.
func NewKey() string {
	u, err := uuid.NewV7()
	if err != nil { // crypto/rand does not fail
		panic("idemclient: making a UUIDv7: " + err.Error())
	}
	return u.String()
}

// KeyFrom returns a key derived from parts, the same in any process: a
// UUID (version 8) made of the SHA-256 of the parts, each prefixed with its
// length, so that ("ab", "c") and ("a", "bc") give different keys. Use it
// for operations that are unique by their content (see the package
// documentation); include the operation's name among the parts, so that two
// operations on one object get two keys.
//
// Precisely, for clients in other languages: SHA-256 over, for each part,
// its length in bytes as an 8-byte big-endian integer followed by its bytes;
// the digest's first 16 bytes, with the high nibble of byte 6 set to 8 and
// the top two bits of byte 8 to 10, written as a lower-case UUID.
func KeyFrom(parts ...string) string {
	h := sha256.New()
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	var u uuid.UUID
	copy(u[:], h.Sum(nil))
	u[6] = u[6]&0x0f | 0x80 // version 8: custom
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	return u.String()
}

type keyCtx struct{}

// WithKey returns a context whose requests carry key: Transport sends it,
// instead of a new one, with every request of a protected method made with
// the context that does not set the header itself. Use it to keep one key
// across retries that go beyond a single RoundTrip.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtx{}, key)
}

// keyFromContext returns the key WithKey put in ctx.
func keyFromContext(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyCtx{}).(string)
	return k, ok
}

// KeyOf returns the Idempotency-Key of the request that got resp, or "" when
// it carried none.
func KeyOf(resp *http.Response) string {
	if resp == nil || resp.Request == nil {
		return ""
	}
	return resp.Request.Header.Get(idem.HeaderName)
}

// Replayed reports whether resp is a stored answer replayed by the server
// (Idempotent-Replayed: true): the operation ran on an earlier attempt, or
// an earlier request with the same key.
func Replayed(resp *http.Response) bool {
	return resp != nil && strings.EqualFold(strings.TrimSpace(resp.Header.Get(headerReplayed)), "true")
}

// Headers idem's servers set on answers.
const (
	headerReplayed = "Idempotent-Replayed"
	headerOutcome  = "Idempotency-Outcome"
)

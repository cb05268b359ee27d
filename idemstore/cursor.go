package idemstore

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrBadCursor is returned by List for a cursor it did not produce.
var ErrBadCursor = errors.New("idem: invalid list cursor")

// EncodeKeyCursor returns an opaque List cursor that resumes after k: the
// three parts length-prefixed, in base64url. SQL drivers, which list in key
// order, share it.
func EncodeKeyCursor(k Key) string {
	b := make([]byte, 0, 3*binary.MaxVarintLen64+len(k.Scope)+len(k.Operation)+len(k.Key))
	for _, part := range [3]string{k.Scope, k.Operation, k.Key} {
		b = appendString(b, part)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// DecodeKeyCursor reverses EncodeKeyCursor. Errors wrap ErrBadCursor.
func DecodeKeyCursor(c string) (Key, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return Key{}, fmt.Errorf("%w: %v", ErrBadCursor, err)
	}
	d := decoder{b: b}
	k := Key{Scope: d.string(), Operation: d.string(), Key: d.string()}
	if d.err != nil || len(d.b) != 0 {
		return Key{}, fmt.Errorf("%w: malformed", ErrBadCursor)
	}
	return k, nil
}

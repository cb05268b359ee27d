package idemseal

import (
	"encoding/binary"
	"fmt"
	"net/http"

	"github.com/idem-dev/idem/idemstore"
)

// sealedV1 is the value of idemstore.SealedHeader in a sealed Response:
// the format of its Body, a blob of keyring.go's format whose plaintext is
// idemstore.EncodeResponse of the headers and body.
const sealedV1 = "1"

// sealedHeader is the Header of every sealed Response. Stores encode or
// copy what they keep and never change it, so one map serves them all;
// nothing in this package changes it either.
var sealedHeader = http.Header{idemstore.SealedHeader: {sealedV1}}

// What a blob is for, the first byte of its binding.
const (
	forResponse = 'R'
	forRequest  = 'Q'
	forLabel    = 'L'
)

// binding is the associated data of a sealed part: what it is for, the
// record's key, and the record's parts kept in clear beside it.
type binding struct {
	purpose      byte
	key          *idemstore.Key
	status       int
	method, path string
	index        string // a label's digest, kept in clear beside it
}

func (b *binding) size() int {
	n := 1 + 5*binary.MaxVarintLen64 + len(b.key.Scope) + len(b.key.Operation) + len(b.key.Key)
	switch b.purpose {
	case forRequest:
		n += len(b.method) + len(b.path)
	case forLabel:
		n += len(b.index)
	}
	return n
}

func (b *binding) appendTo(dst []byte) []byte {
	dst = append(dst, b.purpose)
	dst = appendString(dst, b.key.Scope)
	dst = appendString(dst, b.key.Operation)
	dst = appendString(dst, b.key.Key)
	switch b.purpose {
	case forResponse:
		return binary.AppendVarint(dst, int64(b.status))
	case forLabel:
		return appendString(dst, b.index)
	}
	dst = appendString(dst, b.method)
	return appendString(dst, b.path)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// SealResponse returns r with its headers and body sealed, bound to key
// and r's status. A response with NotReplayable set has neither, and is
// returned as it is. A nil Keyring, as a Sealer, seals nothing and opens
// nothing sealed, as a nil Sealer does.
func (k *Keyring) SealResponse(key idemstore.Key, r *idemstore.Response) (*idemstore.Response, error) {
	if k == nil || r == nil || r.NotReplayable != "" {
		return r, nil
	}
	plain := idemstore.EncodeResponse(&idemstore.Response{Header: r.Header, Body: r.Body})
	blob := k.seal(plain, &binding{purpose: forResponse, key: &key, status: r.Status})
	clear(plain)
	return &idemstore.Response{Status: r.Status, Header: sealedHeader, Body: blob}, nil
}

// OpenResponse returns the response that r seals. A response that is not
// sealed is returned as it is.
func (k *Keyring) OpenResponse(key idemstore.Key, r *idemstore.Response) (*idemstore.Response, error) {
	if !idemstore.IsSealedResponse(r) {
		return r, nil
	}
	if k == nil {
		return nil, fmt.Errorf("%w: its answer is sealed, and no key to open it is configured", idemstore.ErrSealed)
	}
	if v := r.Header[idemstore.SealedHeader]; len(v) != 1 || v[0] != sealedV1 {
		return nil, fmt.Errorf("%w: unknown format %q", idemstore.ErrSealed, v)
	}
	if r.NotReplayable != "" {
		return nil, fmt.Errorf("%w: a sealed answer that was not kept", idemstore.ErrSealed)
	}
	plain, err := k.open(r.Body, &binding{purpose: forResponse, key: &key, status: r.Status})
	if err != nil {
		return nil, err
	}
	inner, err := idemstore.DecodeResponse(plain)
	clear(plain)
	if err != nil || inner == nil || inner.Status != 0 || inner.NotReplayable != "" {
		// Authentic, so sealed by a writer with the key: a bug, not an attack.
		return nil, fmt.Errorf("%w: its plaintext is not an encoded answer", idemstore.ErrSealed)
	}
	inner.Status = r.Status
	return inner, nil
}

// SealRequest returns r with its query and body sealed, bound to key and
// r's method and path. A request with neither is returned as it is.
func (k *Keyring) SealRequest(key idemstore.Key, r *idemstore.Request) (*idemstore.Request, error) {
	if k == nil || r == nil || r.Query == "" && len(r.Body) == 0 {
		return r, nil
	}
	plain := idemstore.EncodeRequest(&idemstore.Request{Query: r.Query, Body: r.Body})
	blob := k.seal(plain, &binding{purpose: forRequest, key: &key, method: r.Method, path: r.Path})
	clear(plain)
	return &idemstore.Request{Method: r.Method, Path: r.Path, Query: idemstore.SealedQuery, Body: blob}, nil
}

// OpenRequest returns the request that r seals. A request that is not
// sealed is returned as it is.
func (k *Keyring) OpenRequest(key idemstore.Key, r *idemstore.Request) (*idemstore.Request, error) {
	if !idemstore.IsSealedRequest(r) {
		return r, nil
	}
	if k == nil {
		return nil, fmt.Errorf("%w: its request is sealed, and no key to open it is configured", idemstore.ErrSealed)
	}
	plain, err := k.open(r.Body, &binding{purpose: forRequest, key: &key, method: r.Method, path: r.Path})
	if err != nil {
		return nil, err
	}
	inner, err := idemstore.DecodeRequest(plain)
	clear(plain)
	if err != nil || inner == nil || inner.Method != "" || inner.Path != "" {
		return nil, fmt.Errorf("%w: its plaintext is not an encoded request", idemstore.ErrSealed)
	}
	inner.Method, inner.Path = r.Method, r.Path
	return inner, nil
}

package idemstore

import (
	"errors"
	"fmt"
)

// Sealer encrypts what a record holds of a client's data before it reaches
// a store, and decrypts it when it is read back: the stored answer's
// headers and body, and the query and body of the request kept for
// operators. The engine calls it on every path that writes or returns a
// record (idem.EngineConfig.Sealer), and the admin API on the records it
// shows and the answers it stores (idemadmin.Config.Sealer), so that a dump
// of the store holds no answer in clear. idemseal.Keyring implements it
// with AES-256-GCM.
//
// A sealed Response keeps Status and NotReplayable in clear; its Header is
// SealedHeader alone, and its Body what the Sealer made of the rest. A
// sealed Request keeps Method and Path in clear; its Query is SealedQuery,
// and its Body what the Sealer made of the rest. A Sealer binds each sealed
// part to the record's Key and to the parts kept in clear, so that a sealed
// answer copied to another key, or given another status, does not open.
//
// The methods must be safe for concurrent use, must not change their
// argument, and return it as it is when there is nothing to do: Seal of a
// Response with NotReplayable set (it has no headers or body), Open of a
// part that is not sealed (stored before sealing was turned on). Open of a
// sealed part that does not open returns an error wrapping ErrSealed.
type Sealer interface {
	SealResponse(key Key, r *Response) (*Response, error)
	OpenResponse(key Key, r *Response) (*Response, error)
	SealRequest(key Key, r *Request) (*Request, error)
	OpenRequest(key Key, r *Request) (*Request, error)
}

// The markers of sealed parts. Neither can come from an HTTP request or
// response: a header name cannot hold a colon, and a query cannot hold a
// control character.
const (
	// SealedHeader is the one header name of a sealed Response; its value
	// names the format.
	SealedHeader = ":idem-sealed"
	// SealedQuery is the Query of a sealed Request.
	SealedQuery = "\x01idem-sealed"
)

// ErrSealed means a record's answer or request is sealed and could not be
// opened: it was sealed with a key the reader does not have (or the reader
// has no Sealer), or it was altered or moved to another record. Such an
// answer must not be replayed, and its operation must not run again: the
// engine returns the error, and idem's middleware answers 500.
var ErrSealed = errors.New("idem: sealed record cannot be opened")

// IsSealedResponse reports whether r is sealed.
func IsSealedResponse(r *Response) bool {
	if r == nil || len(r.Header) != 1 {
		return false
	}
	_, ok := r.Header[SealedHeader]
	return ok
}

// IsSealedRequest reports whether r is sealed.
func IsSealedRequest(r *Request) bool { return r != nil && r.Query == SealedQuery }

// OpenRecord opens rec's sealed Response and Request in place with s. With
// a nil s, a sealed part is an error wrapping ErrSealed, since nothing can
// open it; parts that are not sealed are left as they are.
func OpenRecord(s Sealer, rec *Record) error {
	if s == nil {
		switch {
		case IsSealedResponse(rec.Response):
			return fmt.Errorf("%w: its answer is sealed, and no key to open it is configured", ErrSealed)
		case IsSealedRequest(rec.Request):
			return fmt.Errorf("%w: its request is sealed, and no key to open it is configured", ErrSealed)
		}
		return nil
	}
	if rec.Response != nil {
		r, err := s.OpenResponse(rec.Key, rec.Response)
		if err != nil {
			return err
		}
		rec.Response = r
	}
	if rec.Request != nil {
		r, err := s.OpenRequest(rec.Key, rec.Request)
		if err != nil {
			return err
		}
		rec.Request = r
	}
	return nil
}

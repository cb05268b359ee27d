package idemstore

import (
	"context"
	"fmt"
)

// ResponseReader is implemented by stores that can leave a large stored
// answer out of the record Reserve returns (ReserveParams.InlineResponse)
// and read it apart, later. The engine uses it to bound the memory of
// replays: a front door that keeps a budget of the answers held at once
// (idem serve's max_replay_memory) has the engine take a large answer's
// share of it before the answer is read, so that many retries of a large
// answer read it only as fast as the budget lets them, rather than all at
// once before any of them is known to be a replay.
//
// The answer a record names does not change while it is completed (nothing
// leaves completed but expiry and deletion, and a completed record keeps
// its token): ReadResponse is fenced by that token, so that it returns the
// answer the record named or nothing, never the answer of a record stored
// for the same key after it was deleted or purged.
type ResponseReader interface {
	// ReadResponse returns the answer stored for key, which must still be
	// completed under token (Record.Token). It returns an error wrapping
	// ErrNotFound when it is not: deleted, purged, or completed again
	// under another token since the record was read. The caller then reads
	// the record again. Like Get, the Response is the caller's: the store
	// shares nothing mutable with it.
	ReadResponse(ctx context.Context, key Key, token string) (*Response, error)
}

// ReadResponse reads the answer stored for key under token as
// ResponseReader.ReadResponse does, through s's own ReadResponse when it
// has one, or else through Get, checking the record's state and token. A
// wrapper of stores (metrics, tracing) implements ResponseReader with it
// whatever it wraps, so that a store behind another wrapper that hides
// ReadResponse but passes InlineResponse on is still read right.
func ReadResponse(ctx context.Context, s Store, key Key, token string) (*Response, error) {
	if rr, ok := s.(ResponseReader); ok {
		return rr.ReadResponse(ctx, key, token)
	}
	rec, err := s.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	if rec.State != StateCompleted || rec.Token != token || rec.Response == nil {
		return nil, fmt.Errorf("%w: the record no longer holds the answer stored under that token", ErrNotFound)
	}
	return rec.Response, nil
}

// HeadReader is implemented by stores that can read a record with a large
// stored answer left out, as Reserve does with
// ReserveParams.InlineResponse: an answer longer than inline bytes as the
// store keeps it is not read, and the record's ResponseSize says its size
// instead. A caller that only asks whether a record is there, or what state
// it is in, uses it so that many such questions about a key with a large
// answer do not each hold that answer (idem serve's lookup of records
// stored under an earlier version's operation names, on every protected
// request).
type HeadReader interface {
	// GetHead is Get, with an answer longer than inline bytes (when
	// positive) left out.
	GetHead(ctx context.Context, key Key, inline int) (*Record, error)
}

// GetHead reads the record for key as HeadReader.GetHead does, through s's
// own GetHead when it has one, or else through Get (the answer whole). A
// wrapper of stores implements HeadReader with it whatever it wraps.
func GetHead(ctx context.Context, s Store, key Key, inline int) (*Record, error) {
	if hr, ok := s.(HeadReader); ok {
		return hr.GetHead(ctx, key, inline)
	}
	return s.Get(ctx, key)
}

// DecodeReadResponse decodes the bytes a store's ReadResponse read, as
// DecodeResponse does, except that a record completed without an answer
// is ErrNotFound (it has none to read apart), and that an empty body is
// an empty slice, not nil.
func DecodeReadResponse(b []byte) (*Response, error) {
	resp, err := DecodeResponse(b)
	if err != nil {
		return nil, err
	}
	if resp == nil {
		return nil, ErrNotFound
	}
	if resp.Body == nil {
		resp.Body = []byte{}
	}
	return resp, nil
}

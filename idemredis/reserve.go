package idemredis

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
)

// Reserve creates a pending record unless one exists, in one atomic script
// that takes the lease and times from the server's TIME and otherwise
// returns the existing record, read at that TIME. The script cannot see a
// record vanish between the failed insert and the read, so it never needs
// the contract's retry loop. A completed record whose retention is over but
// which Purge (or its TTL) has not removed yet is returned like any other.
//
// go-redis resends a command whose connection broke before the reply came
// back, so the script may run twice for one call. An existing pending record
// that carries p.Token and p.Fingerprint can only be this call's own insert
// (tokens are unique per attempt), and Reserve reports it as created.
func (s *Store) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	res, err := reserveScript.Run(ctx, s.client, []string{s.recordKey(p.Key)},
		p.Key.Scope, p.Key.Operation, p.Key.Key, p.Fingerprint, p.Token,
		durMicros(p.Lease), idemstore.EncodeRequest(p.Request)).Result()
	if err != nil {
		return nil, false, interpretError(ctx, err)
	}
	vals, ok := res.([]any)
	if !ok {
		return nil, true, nil
	}
	rec, err := s.checked(p.Key, vals)
	if err != nil {
		return nil, false, err
	}
	if rec == nil {
		return nil, false, errors.New("idemredis: reserve found a record without state")
	}
	if p.Token != "" && rec.Token == p.Token && rec.Fingerprint == p.Fingerprint && rec.State == idemstore.StatePending {
		return nil, true, nil // ours: a resent command whose first attempt went in
	}
	return rec, false, nil
}

// Get returns the record for key, read together with the server's TIME
// (its ReadAt) in one script, or an error wrapping idemstore.ErrNotFound.
func (s *Store) Get(ctx context.Context, key idemstore.Key) (*idemstore.Record, error) {
	vals, err := getScript.Run(ctx, s.client, []string{s.recordKey(key)}).Slice()
	if err != nil {
		return nil, interpretError(ctx, err)
	}
	rec, err := s.checked(key, vals)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, interpretError(ctx, redis.Nil)
	}
	return rec, nil
}

// checked decodes the reply of the get or reserve script for key and makes
// sure the record is that key's: two keys can only share a hash if SHA-256
// collides, but a record must never be served to the wrong caller.
func (s *Store) checked(key idemstore.Key, vals []any) (*idemstore.Record, error) {
	rec, err := decodeRead(vals)
	if err != nil || rec == nil {
		return nil, err
	}
	if rec.Key != key {
		return nil, fmt.Errorf("idemredis: record under %s belongs to another key", s.recordKey(key))
	}
	return rec, nil
}

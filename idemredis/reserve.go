package idemredis

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// Reserve creates a pending record unless one exists, in one atomic script
// that takes the lease and times from the server's TIME and otherwise
// returns the existing record, read at that TIME. The script cannot see a
// record vanish between the failed insert and the read, so it never needs
// the contract's retry loop. A completed record whose retention is over but
// which Purge (or its TTL) has not removed yet is returned like any other.
//
// The script is sent again when its reply is lost (see Config.Resends), so
// it may run twice for one call. An existing pending record that carries
// p.Token and p.Fingerprint can only be this call's own insert (tokens are
// unique per attempt), and Reserve reports it as created.
func (s *Store) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	msg, err := s.run(ctx, reserveScript, []string{s.recordKey(p.Key)}, []string{
		p.Key.Scope, p.Key.Operation, p.Key.Key, p.Fingerprint, p.Token,
		durMicros(p.Lease), rueidis.BinaryString(idemstore.EncodeRequest(p.Request)),
	})
	if err != nil {
		return nil, false, err
	}
	if msg.IsInt64() {
		return nil, true, nil
	}
	rec, err := s.checked(p.Key, msg)
	if err != nil {
		return nil, false, err
	}
	if rec == nil {
		return nil, false, errors.New("idemredis: reserve found a record without state")
	}
	if p.Token != "" && rec.Token == p.Token && rec.Fingerprint == p.Fingerprint && rec.State == idemstore.StatePending {
		return nil, true, nil // ours: a resent script whose first run went in
	}
	return rec, false, nil
}

// Get returns the record for key, read together with the server's TIME
// (its ReadAt) in one script, or an error wrapping idemstore.ErrNotFound.
func (s *Store) Get(ctx context.Context, key idemstore.Key) (*idemstore.Record, error) {
	msg, err := s.run(ctx, getScript, []string{s.recordKey(key)}, nil)
	if err != nil {
		return nil, err
	}
	rec, err := s.checked(key, msg)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, interpretError(ctx, rueidis.Nil)
	}
	return rec, nil
}

// checked decodes the reply of the get or reserve script for key and makes
// sure the record is that key's: two keys can only share a hash if SHA-256
// collides, but a record must never be served to the wrong caller.
func (s *Store) checked(key idemstore.Key, msg rueidis.RedisMessage) (*idemstore.Record, error) {
	vals, err := msg.ToArray()
	if err != nil {
		return nil, fmt.Errorf("idemredis: unexpected reply to a read: %w", err)
	}
	rec, err := decodeRead(vals)
	if err != nil || rec == nil {
		return nil, err
	}
	if rec.Key != key {
		return nil, fmt.Errorf("idemredis: record under %s belongs to another key", s.recordKey(key))
	}
	return rec, nil
}

package idemredis

import (
	"context"
	"errors"
	"fmt"
	"strconv"

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
// unique per attempt), and Reserve reports it as created. When ctx ends
// before the reply, Reserve still waits a moment for it before it returns
// ctx's error, so that the caller's release of the token cannot overtake
// the script (see abandon.go).
//
// With p.InlineResponse positive, an existing record's answer longer than
// that many bytes as stored is left out of the record returned, which says
// its size instead (Record.ResponseSize): the script reads the answer's
// size, not the answer, and ReadResponse reads it later.
//
// While the last policy check found a node whose maxmemory-policy can evict
// records, Reserve sends nothing and fails with ErrUnavailable (see
// CheckPolicy).
func (s *Store) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	if err := s.admit(); err != nil {
		return nil, false, err
	}
	key, token, fp := p.Key, p.Token, p.Fingerprint
	tail := pendingTail(key, token, fp, idemstore.EncodeRequest(p.Request), p.ScopeLabel)
	names := s.keys(key)
	keys := []string{names.record, names.ix.key, names.ix.all}
	args := []string{durMicros(p.Lease), rueidis.BinaryString(tail), keyMember(key), ageMember(key), strconv.Itoa(max(p.InlineResponse, 0))}
	if p.ScopeLabel != "" {
		keys = append(keys, names.ix.label)
		args = append(args, labelMember(idemstore.ScopeLabelIndex(p.ScopeLabel), key))
	}
	msg, err := s.claim(ctx, s.scripts().reserve, keys, args)
	if err != nil {
		return nil, false, err
	}
	return s.reserveReply(key, token, fp, msg)
}

// reserveReply decodes the reply of the reserve script for key, sent with
// token and fingerprint fp: created, or the record that exists.
func (s *Store) reserveReply(key idemstore.Key, token, fp string, msg rueidis.RedisMessage) (*idemstore.Record, bool, error) {
	if msg.IsInt64() {
		return nil, true, nil
	}
	rec, err := s.checked(key, msg)
	if err != nil {
		return nil, false, err
	}
	if rec == nil {
		return nil, false, errors.New("idemredis: reserve found a record without state")
	}
	if token != "" && rec.Token == token && rec.Fingerprint == fp && rec.State == idemstore.StatePending {
		return nil, true, nil // ours: a resent script whose first run went in
	}
	return rec, false, nil
}

// Get returns the record for key, read together with the server's TIME
// (its ReadAt) in one script, or an error wrapping idemstore.ErrNotFound.
func (s *Store) Get(ctx context.Context, key idemstore.Key) (*idemstore.Record, error) {
	return s.GetHead(ctx, key, 0)
}

// GetHead is Get with an answer longer than inline bytes (when positive)
// left out (see idemstore.HeadReader), read as Reserve reads it with
// ReserveParams.InlineResponse: the script reads the record's head and
// the answer's size (STRLEN, or HSTRLEN for a record of an earlier
// version), not the answer.
func (s *Store) GetHead(ctx context.Context, key idemstore.Key, inline int) (*idemstore.Record, error) {
	var args []string
	if inline > 0 {
		args = []string{strconv.Itoa(inline)}
	}
	msg, err := s.run(ctx, s.scripts().get, []string{s.recordKey(key)}, args)
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

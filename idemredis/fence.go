package idemredis

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

var errNilResponse = errors.New("idemredis: Complete needs a Response")

// Complete stores the response and completes the record, fenced by the
// token, expiring p.Retention after the server's TIME. The lease deadline
// is not checked: the token alone fences. The key's TTL is the retention
// plus Config.RetentionGrace (see ttlMillis).
func (s *Store) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	if p.Response == nil {
		return errNilResponse
	}
	names := s.keys(p.Key)
	msg, err := s.run(ctx, s.scripts().complete, []string{names.record, names.tombstone, names.scratch, names.ix.all}, s.fenceArgs(p.Token, false,
		rueidis.BinaryString(idemstore.EncodeResponse(p.Response)), durMicros(p.Retention), s.ttlMillis(p.Retention), ageMember(p.Key)))
	if err != nil {
		return err
	}
	return fenceResult(msg)
}

// Release deletes the record if it is still pending under p.Token (and,
// with p.IfExpired, its lease has expired by the server's TIME).
func (s *Store) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	names := s.keys(p.Key)
	msg, err := s.run(ctx, s.scripts().release, names.indexed(), s.fenceArgs(p.Token, p.IfExpired, tombstoneMillis, keyMember(p.Key), ageMember(p.Key)))
	if err != nil {
		return err
	}
	return fenceResult(msg)
}

// Escalate moves a pending record to needs_review (with p.IfExpired, only
// one whose lease has expired by the server's TIME).
func (s *Store) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	names := s.keys(p.Key)
	msg, err := s.run(ctx, s.scripts().escalate, []string{names.record, names.tombstone, names.ix.all, names.ix.review},
		s.fenceArgs(p.Token, p.IfExpired, p.Reason, ageMember(p.Key)))
	if err != nil {
		return err
	}
	return fenceResult(msg)
}

// Extend moves the lease deadline of a pending record to the server's TIME
// plus p.Lease, whether or not the lease has run out.
func (s *Store) Extend(ctx context.Context, p idemstore.ExtendParams) error {
	return s.fenced(ctx, s.scripts().extend, p.Key, p.Token, false, durMicros(p.Lease))
}

// Takeover gives a pending record whose lease expired by the server's TIME
// a new token and a lease of p.Lease from that TIME. Like Reserve, it waits
// a moment for its script's reply when ctx ends first (see abandon.go).
// Like Reserve, it fails with ErrUnavailable while the last policy check
// found a node that can evict records.
func (s *Store) Takeover(ctx context.Context, p idemstore.TakeoverParams) error {
	if err := s.admit(); err != nil {
		return err
	}
	names := s.keys(p.Key)
	args := s.fenceArgs(p.OldToken, true, p.NewToken, durMicros(p.Lease))
	msg, err := s.claim(ctx, s.scripts().takeover, []string{names.record, names.tombstone}, args)
	if err != nil {
		return err
	}
	return fenceResult(msg)
}

// fenced runs one of the token-fenced scripts (see fence in scripts.go)
// with a fresh call id and maps its 0 to ErrLeaseLost.
func (s *Store) fenced(ctx context.Context, script *rueidis.Lua, key idemstore.Key, token string, ifExpired bool, args ...string) error {
	names := s.keys(key)
	msg, err := s.run(ctx, script, []string{names.record, names.tombstone}, s.fenceArgs(token, ifExpired, args...))
	if err != nil {
		return err
	}
	return fenceResult(msg)
}

// fenceArgs returns the ARGV of a fenced script: the three that every one
// takes (see fence in scripts.go), with a fresh call id, then args.
func (s *Store) fenceArgs(token string, ifExpired bool, args ...string) []string {
	expired := ""
	if ifExpired {
		expired = "1"
	}
	argv := make([]string, 0, 3+len(args))
	argv = append(argv, token, s.callID(), expired)
	return append(argv, args...)
}

// fenceResult maps a fenced script's reply: 1 is success, 0 ErrLeaseLost.
func fenceResult(msg rueidis.RedisMessage) error {
	n, err := msg.AsInt64()
	if err != nil {
		return fmt.Errorf("idemredis: unexpected reply to a state change: %w", err)
	}
	if n != 1 {
		return fmt.Errorf("idemredis: %w", idemstore.ErrLeaseLost)
	}
	return nil
}

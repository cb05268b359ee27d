package idemredis

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
)

// Reserve creates a pending record unless one exists, in one atomic script
// that also returns the existing record. The script cannot see a record
// vanish between the failed insert and the read, so it never needs the
// contract's retry loop.
//
// go-redis resends a command whose connection broke before the reply came
// back, so the script may run twice for one call. An existing pending record
// that carries p.Token and p.Fingerprint can only be this call's own insert
// (tokens are unique per attempt), and Reserve reports it as created.
func (s *Store) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	res, err := reserveScript.Run(ctx, s.client, []string{s.recordKey(p.Key)},
		p.Key.Scope, p.Key.Operation, p.Key.Key, p.Fingerprint, p.Token,
		micros(p.LeaseUntil), micros(p.Now)).Result()
	if err != nil {
		return nil, false, interpretError(ctx, err)
	}
	if vals, ok := res.([]any); ok {
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
	return nil, true, nil
}

// Get returns the record for key, or an error wrapping idemstore.ErrNotFound.
func (s *Store) Get(ctx context.Context, key idemstore.Key) (*idemstore.Record, error) {
	vals, err := s.client.HMGet(ctx, s.recordKey(key), fieldNames[:]...).Result()
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

// checked decodes a record read for key and makes sure it is that key's:
// two keys can only share a hash if SHA-256 collides, but a record must
// never be served to the wrong caller.
func (s *Store) checked(key idemstore.Key, vals []any) (*idemstore.Record, error) {
	rec, err := decodeRecord(vals)
	if err != nil || rec == nil {
		return nil, err
	}
	if rec.Key != key {
		return nil, fmt.Errorf("idemredis: record under %s belongs to another key", s.recordKey(key))
	}
	return rec, nil
}

// Complete stores the response and completes the record, fenced by the
// token. The lease deadline is not checked: the token alone fences.
func (s *Store) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	return s.fenced(ctx, completeScript, p.Key, p.Token,
		idemstore.EncodeResponse(p.Response), micros(p.ExpiresAt), s.ttlMillis(p.Now, p.ExpiresAt))
}

// Release deletes the record if it is still pending under token.
func (s *Store) Release(ctx context.Context, key idemstore.Key, token string) error {
	return s.fenced(ctx, releaseScript, key, token)
}

// Escalate moves a pending record to needs_review.
func (s *Store) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	return s.fenced(ctx, escalateScript, p.Key, p.Token, p.Reason)
}

// Extend moves the lease deadline of a pending record.
func (s *Store) Extend(ctx context.Context, p idemstore.ExtendParams) error {
	return s.fenced(ctx, extendScript, p.Key, p.Token, micros(p.LeaseUntil))
}

// Takeover gives a pending record whose lease expired at or before p.Now a
// new token and lease deadline. A pending record that already carries
// p.NewToken was taken over by this call (a resent script, see Reserve), so
// that counts as success.
func (s *Store) Takeover(ctx context.Context, p idemstore.TakeoverParams) error {
	return s.fenced(ctx, takeoverScript, p.Key, p.OldToken,
		micros(p.Now), p.NewToken, micros(p.LeaseUntil))
}

// fenced runs one of the token-fenced scripts and maps its 0 to ErrLeaseLost.
func (s *Store) fenced(ctx context.Context, script *redis.Script, key idemstore.Key, token string, args ...any) error {
	names := s.keys(key)
	argv := make([]any, 0, 3+len(args))
	argv = append(argv, names.channel, s.publishCmd(), token)
	argv = append(argv, args...)
	n, err := script.Run(ctx, s.client, []string{names.record}, argv...).Int64()
	if err != nil {
		return interpretError(ctx, err)
	}
	if n != 1 {
		return fmt.Errorf("idemredis: %w", idemstore.ErrLeaseLost)
	}
	return nil
}

// Resolve settles a needs_review record: completes it with p.Response or
// deletes it.
func (s *Store) Resolve(ctx context.Context, p idemstore.ResolveParams) error {
	var action string
	switch p.Action {
	case idemstore.ResolveComplete:
		if p.Response == nil {
			return errors.New("idemredis: Resolve with ResolveComplete needs a Response")
		}
		action = "complete"
	case idemstore.ResolveRelease:
		action = "release"
	default:
		return fmt.Errorf("idemredis: unknown resolve action %d", p.Action)
	}
	names := s.keys(p.Key)
	n, err := resolveScript.Run(ctx, s.client, []string{names.record},
		names.channel, s.publishCmd(), action, idemstore.EncodeResponse(p.Response),
		micros(p.ExpiresAt), s.ttlMillis(p.Now, p.ExpiresAt), p.Reason).Int64()
	if err != nil {
		return interpretError(ctx, err)
	}
	switch n {
	case 1:
		return nil
	case -1:
		return interpretError(ctx, redis.Nil)
	default:
		return fmt.Errorf("idemredis: %w", idemstore.ErrNotNeedsReview)
	}
}

func (s *Store) publishCmd() string {
	if s.cfg.ClassicPubSub {
		return "PUBLISH"
	}
	return "SPUBLISH"
}

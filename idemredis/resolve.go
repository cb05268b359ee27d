package idemredis

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// Resolve settles a needs_review record: completes it with p.Response,
// expiring p.Retention after the server's TIME, or deletes it.
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
	msg, err := s.run(ctx, s.scripts().resolve, names.indexed(), []string{
		s.callID(), action, rueidis.BinaryString(idemstore.EncodeResponse(p.Response)),
		durMicros(p.Retention), s.ttlMillis(p.Retention), p.Reason, tombstoneMillis, p.Token,
		keyMember(p.Key), ageMember(p.Key),
	})
	if err != nil {
		return err
	}
	return s.stateResult(ctx, msg, idemstore.ErrNotNeedsReview)
}

// Delete removes a completed record before its retention ends; with
// p.Token, only the answer stored under that token.
func (s *Store) Delete(ctx context.Context, p idemstore.DeleteParams) error {
	names := s.keys(p.Key)
	msg, err := s.run(ctx, s.scripts().delete, names.indexed(), []string{
		s.callID(), tombstoneMillis, p.Token, keyMember(p.Key), ageMember(p.Key),
	})
	if err != nil {
		return err
	}
	return s.stateResult(ctx, msg, idemstore.ErrNotCompleted)
}

// stateResult maps the reply of the resolve and delete scripts: 1 success,
// -1 missing record, -2 a record in another state (wrong), -3 a record in
// the wanted state under another token.
func (s *Store) stateResult(ctx context.Context, msg rueidis.RedisMessage, wrong error) error {
	n, err := msg.AsInt64()
	if err != nil {
		return fmt.Errorf("idemredis: unexpected reply to a state change: %w", err)
	}
	switch n {
	case 1:
		return nil
	case -1:
		return interpretError(ctx, rueidis.Nil)
	case -3:
		return fmt.Errorf("idemredis: the record carries another token: %w", idemstore.ErrLeaseLost)
	default:
		return fmt.Errorf("idemredis: %w", wrong)
	}
}

package idemredis

import (
	"context"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
)

var (
	_ idemstore.ResponseReader = (*Store)(nil)
	_ idemstore.HeadReader     = (*Store)(nil)
)

// ReadResponse returns the answer of the record for key while it is
// completed under token, or an error wrapping idemstore.ErrNotFound (see
// idemstore.ResponseReader): one script checks the record's state and
// token and returns only the answer, so that the answer cannot be
// another record's, stored for the key after the one read was deleted or
// purged. A record past its expires-at is read while its key lasts
// (Config.RetentionGrace), as Reserve and Get return it. A record of an
// earlier version (a hash, see legacy.go) is read too.
func (s *Store) ReadResponse(ctx context.Context, key idemstore.Key, token string) (*idemstore.Response, error) {
	if token == "" {
		return nil, fmt.Errorf("%w: no token", idemstore.ErrNotFound)
	}
	msg, err := s.run(ctx, s.scripts().response, []string{s.recordKey(key)}, []string{token})
	if err != nil {
		return nil, err
	}
	b, err := msg.ToString()
	if err != nil {
		return nil, fmt.Errorf("idemredis: unexpected reply to a read of an answer: %w", err)
	}
	if b == "" {
		return nil, fmt.Errorf("%w: the record no longer holds an answer stored under that token", idemstore.ErrNotFound)
	}
	resp, err := idemstore.DecodeResponse([]byte(b))
	if err != nil {
		return nil, err
	}
	if resp.Body == nil {
		resp.Body = []byte{}
	}
	return resp, nil
}

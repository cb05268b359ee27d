package idem

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// Keys in logs. A log line names a key by its digest, key_digest
// (KeyDigest), never by the key itself: keys may be guessable, and a log
// is read by more people than the store. One line is the exception, the
// one an operator must act on: "idem: key needs review", logged once per
// key that goes to review (at warn), carries the key itself with its
// scope, operation, digest and admin id, so that the operator can find
// it, and grep its digest for the other lines about it. The proxy holds
// its own lines to the same rule: a key appears in clear only on lines
// about a key in review (that line, the resolver's answer about it, a
// review webhook that failed) and in the admin API's record of an
// operator's action.

// KeyDigest is how log lines name k: the first 12 hex digits of the
// SHA-256 of its scope, operation and key.
func KeyDigest(k Key) string { return redact(k) }

// digestAttr is the attribute that names k on a log line.
func digestAttr(k Key) slog.Attr { return slog.String("key_digest", redact(k)) }

// reviewAttrs are the attributes of the line that says k went to review:
// the key itself, for the operator.
func reviewAttrs(k Key) []slog.Attr {
	return []slog.Attr{slog.String("scope", k.Scope), slog.String("operation", k.Operation), slog.String("key", k.Key),
		digestAttr(k), slog.String("id", idemstore.EncodeKeyCursor(k))}
}

// storeDownEvery is how often at most the line saying the store cannot be
// reached is logged, per message: a store that is down fails every request.
const storeDownEvery = 10 * time.Second

// logStoreDown logs, at error, that checking a key failed and what
// requests get meanwhile (what), plainly when the store cannot be reached:
// at most one line per message every storeDownEvery, with the number left
// out since.
func (e *Engine) logStoreDown(ctx context.Context, err error, what string, attrs ...slog.Attr) {
	msg := "idem: checking the key failed; " + what
	if errors.Is(err, idemstore.ErrUnavailable) {
		msg = "idem: the store is unreachable; " + what
	}
	ok, leftOut := e.storeDown.Allow(msg)
	if !ok {
		return
	}
	e.cfg.Logger.LogAttrs(ctx, slog.LevelError, msg, append(attrs, slog.Any("error", err), slog.Int("unlogged_since_last", leftOut))...)
}

package idemredis

import (
	"fmt"
	"strconv"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// micros encodes a time as Unix microseconds; the zero time encodes as "".
// Microseconds stay exact in Lua's doubles for any realistic date.
func micros(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return strconv.FormatInt(t.UnixMicro(), 10)
}

func parseMicros(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMicro(v).UTC(), nil
}

// ttlMillis is the Redis TTL of a completed record: its remaining retention
// measured on the caller's clock, plus the grace. Using a relative TTL
// (PEXPIRE, not PEXPIREAT) means Redis's own clock only measures a
// duration, so a store shared by hosts with skewed clocks, or driven by a
// test clock, still keeps records for as long as the caller asked.
func (s *Store) ttlMillis(now, expiresAt time.Time) int64 {
	d := max(expiresAt.Sub(now), 0) + s.cfg.RetentionGrace
	return (d + time.Millisecond - 1).Milliseconds()
}

// decodeRecord turns the values read in fieldNames order into a Record. It
// returns (nil, nil) when the hash does not exist.
func decodeRecord(vals []any) (*idemstore.Record, error) {
	if len(vals) != numFields {
		return nil, fmt.Errorf("idemredis: record has %d fields, want %d", len(vals), numFields)
	}
	if vals[fState] == nil {
		return nil, nil
	}
	str := func(i int) string {
		s, _ := vals[i].(string)
		return s
	}
	rec := &idemstore.Record{
		Key:         idemstore.Key{Scope: str(fScope), Operation: str(fOperation), Key: str(fKey)},
		Fingerprint: str(fFingerprint),
		State:       idemstore.State(str(fState)),
		Token:       str(fToken),
		Reason:      str(fReason),
	}
	var err error
	if rec.LeaseUntil, err = parseMicros(str(fLeaseUntil)); err != nil {
		return nil, fmt.Errorf("idemredis: bad lease_until: %w", err)
	}
	if rec.CreatedAt, err = parseMicros(str(fCreatedAt)); err != nil {
		return nil, fmt.Errorf("idemredis: bad created_at: %w", err)
	}
	if rec.ExpiresAt, err = parseMicros(str(fExpiresAt)); err != nil {
		return nil, fmt.Errorf("idemredis: bad expires_at: %w", err)
	}
	if rec.Response, err = idemstore.DecodeResponse([]byte(str(fResponse))); err != nil {
		return nil, err
	}
	return rec, nil
}

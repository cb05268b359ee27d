package idemredis

import (
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// A record is one hash, <prefix>:{<tag>}:r, with these fields:
//
//	s, o, k  scope, operation and key as the client gave them
//	fp       fingerprint
//	st       state: pending, completed or needs_review
//	tok      fencing token
//	lu       lease deadline, Unix microseconds by the server's TIME (data, not a TTL)
//	resp     idemstore.EncodeResponse of the stored answer
//	rsn      review reason
//	ca       created at, Unix microseconds
//	ea       expires at, Unix microseconds (a completed record only)
//	ua       updated at, Unix microseconds (absent in records written
//	         before it existed: CreatedAt stands in)
//	req      idemstore.EncodeRequest of the request that reserved the key
//	         (absent when none was given)
//	lc       call id of the last Complete, Escalate, Takeover or Resolve,
//	         by which a resent script recognises its own change (see
//	         resend.go); never decoded
//
// Every time is the server's: the scripts read it with TIME.

// Positions of the fields in fieldNames, the order in which Get, the
// listing and the reserve script read them and decodeRecord expects them.
const (
	fScope = iota
	fOperation
	fKey
	fFingerprint
	fState
	fToken
	fLeaseUntil
	fResponse
	fReason
	fCreatedAt
	fExpiresAt
	fUpdatedAt
	fRequest
	numFields
)

var fieldNames = [numFields]string{"s", "o", "k", "fp", "st", "tok", "lu", "resp", "rsn", "ca", "ea", "ua", "req"}

// durMicros encodes a duration as whole microseconds for the scripts, which
// add it to the server's TIME. A positive duration is rounded up, so a lease
// of any positive length has not expired at the moment it is granted; zero
// and negative ones are rounded towards zero and give a deadline at or before
// now, which has expired.
func durMicros(d time.Duration) string {
	us := d / time.Microsecond
	if d > 0 && d%time.Microsecond != 0 {
		us++
	}
	return strconv.FormatInt(int64(us), 10)
}

// micros encodes a time as Unix microseconds; the zero time encodes as "".
func micros(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return strconv.FormatInt(t.UnixMicro(), 10)
}

// parseMicros decodes Unix microseconds as the scripts write them; ""
// decodes as the zero time.
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

// ttlMillis is the Redis TTL of a completed record kept for retention: the
// retention, counted as zero when it is negative, plus the grace. A
// completed record therefore stays at least RetentionGrace, long enough for
// Purge to find one whose retention is already over. The TTL is relative
// (PEXPIRE), so Redis's clock only measures a duration.
func (s *Store) ttlMillis(retention time.Duration) string {
	d := max(retention, 0) + s.cfg.RetentionGrace
	return strconv.FormatInt((d + time.Millisecond - 1).Milliseconds(), 10)
}

// decodeRecord turns the values read in fieldNames order into a Record
// read at readAt. It returns (nil, nil) when the hash does not exist.
func decodeRecord(vals []rueidis.RedisMessage, readAt time.Time) (*idemstore.Record, error) {
	if len(vals) != numFields {
		return nil, fmt.Errorf("idemredis: record has %d fields, want %d", len(vals), numFields)
	}
	// A missing field comes back as a nil, or, from a script on a RESP3
	// connection, as false (Lua's nil): anything but a string.
	if !vals[fState].IsString() {
		return nil, nil
	}
	str := func(i int) string {
		s, _ := vals[i].ToString() // "" for a missing field
		return s
	}
	rec := &idemstore.Record{
		Key:         idemstore.Key{Scope: str(fScope), Operation: str(fOperation), Key: str(fKey)},
		Fingerprint: str(fFingerprint),
		State:       idemstore.State(str(fState)),
		Token:       str(fToken),
		Reason:      str(fReason),
		ReadAt:      readAt,
	}
	for _, t := range [...]struct {
		field int
		dst   *time.Time
		name  string
	}{
		{fLeaseUntil, &rec.LeaseUntil, "lease_until"},
		{fCreatedAt, &rec.CreatedAt, "created_at"},
		{fExpiresAt, &rec.ExpiresAt, "expires_at"},
		{fUpdatedAt, &rec.UpdatedAt, "updated_at"},
	} {
		v, err := parseMicros(str(t.field))
		if err != nil {
			return nil, fmt.Errorf("idemredis: bad %s: %w", t.name, err)
		}
		*t.dst = v
	}
	if rec.UpdatedAt.IsZero() {
		rec.UpdatedAt = rec.CreatedAt // written before updated_at existed
	}
	var err error
	if rec.Response, err = idemstore.DecodeResponse([]byte(str(fResponse))); err != nil {
		return nil, err
	}
	if rec.Request, err = idemstore.DecodeRequest([]byte(str(fRequest))); err != nil {
		return nil, err
	}
	return rec, nil
}

// decodeRead decodes the reply of the get and reserve scripts: the server's
// TIME in Unix microseconds, then the fields in fieldNames order.
func decodeRead(vals []rueidis.RedisMessage) (*idemstore.Record, error) {
	if len(vals) != 1+numFields {
		return nil, fmt.Errorf("idemredis: read returned %d values, want %d", len(vals), 1+numFields)
	}
	now, _ := vals[0].ToString()
	readAt, err := parseMicros(now)
	if err != nil || readAt.IsZero() {
		return nil, fmt.Errorf("idemredis: bad server time %q", now)
	}
	return decodeRecord(vals[1:], readAt)
}

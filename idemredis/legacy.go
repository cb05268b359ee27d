package idemredis

import (
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// Earlier versions of the store kept a record as a hash under the same key,
// with these fields:
//
//	s, o, k  scope, operation and key as the client gave them
//	fp       fingerprint
//	st       state: pending, completed or needs_review
//	tok      fencing token
//	lu       lease deadline, Unix microseconds by the server's TIME
//	resp     idemstore.EncodeResponse of the stored answer
//	rsn      review reason
//	ca       created at, Unix microseconds
//	ea       expires at, Unix microseconds (a completed record only)
//	ua       updated at, Unix microseconds (absent in the oldest records:
//	         CreatedAt stands in)
//	req      idemstore.EncodeRequest of the request (absent when none)
//	lc       call id of the last Complete, Escalate, Takeover or Resolve
//
// and, written only by this version, w, 1 once someone subscribed.
//
// The store reads such records as long as they exist, which for pending
// and needs_review records is until they are settled: every script that
// reads a record turns a hash into the string layout in memory first (see
// legacyLua), and a script that changes the record's state, lease or token
// writes it back in the string layout. A completed hash is never
// rewritten; it expires with its TTL or is purged. The listings read
// hashes with HMGET (decodeHash). The old call id (32 hex digits) is not
// carried over: it only recognised resends of calls made before the
// upgrade.
//
// While processes of both versions share a Redis (a rolling upgrade), a
// process of the previous version fails on every record in the string
// layout (WRONGTYPE), before it changes anything: a retry it receives of a
// key written by a new process gets an error instead of running, and its
// List, ListExpiredLeases and Purge, which SCAN with TYPE hash, pass such
// records by (the TTL still removes completed ones). A new process never rewrites a hash that a process of the
// previous version may still settle under its own token: it only rewrites
// a pending hash under a token it holds itself (after a takeover), and a
// subscription marks a pending hash with a field of its own, w, which the
// previous version ignores (it publishes every change anyway) and legacy
// reads as the waiters flag.

// Positions of the fields in hashFields, the order in which the listings
// read a hash and decodeHash expects them.
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

var hashFields = [numFields]string{"s", "o", "k", "fp", "st", "tok", "lu", "resp", "rsn", "ca", "ea", "ua", "req"}

// legacyLua defines legacy(key, limit), which returns the hash at key in
// the string layout of record.go, or an empty string when the hash has no
// state. The times are decimal strings in the hash; a missing one is 0,
// except updated at, which is created at. With limit positive, an answer
// longer than limit bytes (HSTRLEN) is not read: the record then ends
// without it, and legacy returns the answer's size second (0 when the
// answer is there, or there is none).
const legacyLua = `
local function legacy(key, limit)
  local rf, size = 'resp', 0
  if limit and limit > 0 then
    local n = redis.call('HSTRLEN', key, 'resp')
    if n > limit then rf, size = '', n end
  end
  local h = redis.call('HMGET', key, 's', 'o', 'k', 'fp', 'st', 'tok', 'lu', rf, 'rsn', 'ca', 'ea', 'ua', 'req', 'w')
  local st = ({pending = 'p', completed = 'c', needs_review = 'r'})[h[5] or '']
  if not st then return '', 0 end
  local function f(i) return h[i] or '' end
  local function n(i) return tonumber(h[i] or '') or 0 end
  local ca = n(10)
  local ua = n(12)
  if ua == 0 then ua = ca end
  return struct.pack('>Bc1Bi8i8i8i8c16I4c0I4c0I4c0I4c0I4c0I4c0I4c0', 1, st, n(14), n(7), ca, n(11), ua, string.rep('\0', 16),
    #f(6), f(6), #f(2), f(2), #f(1), f(1), #f(3), f(3), #f(4), f(4), #f(13), f(13), #f(9), f(9)) .. f(8), size
end
`

// decodeHash turns the values of a hash read in hashFields order into a
// Record read at readAt. It returns (nil, nil) when the hash does not
// exist.
func decodeHash(vals []rueidis.RedisMessage, readAt time.Time) (*idemstore.Record, error) {
	if len(vals) != numFields {
		return nil, fmt.Errorf("idemredis: record has %d fields, want %d", len(vals), numFields)
	}
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

package idemredis

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// A record is one string, <prefix>:{<tag>}:r, in this layout (integers
// big-endian, times Unix microseconds by the server's TIME, 0 for none):
//
//	offset  size  field
//	0       1     layout: 1 (recordLayout), or 2 (labelLayout) for a record
//	              with a scope label
//	1       1     state: 'p' pending, 'c' completed, 'r' needs_review
//	2       1     flags: bit 0 set while someone waits for a change of the
//	              pending record (see notify.go)
//	3       8     lease deadline (data, not a TTL)
//	11      8     created at
//	19      8     expires at (a completed record only)
//	27      8     updated at
//	35      16    call id of the last Complete, Escalate, Takeover or
//	              Resolve, by which a resent script recognises its own
//	              change (see resend.go); zeros for none
//	51      4+n   fencing token
//	        4+n   operation, scope, key, fingerprint: each a 4-byte length
//	              and the bytes, as the client gave them
//	        4+n   idemstore.EncodeRequest of the request that reserved the
//	              key (length 0 when none was given)
//	        4+n   scope label, as ReserveParams.ScopeLabel gave it (layout
//	              2 only)
//	        4+n   review reason
//	        rest  idemstore.EncodeResponse of the stored answer, to the end
//	              of the string (empty while there is none)
//
// The first 51 bytes have a fixed size, so the scripts that change only
// them (Complete, Extend) read a prefix with GETRANGE and write the head
// with SETRANGE, and Complete puts the answer after the record without
// making the record a Lua string (SETRANGE and BITOP, see completeScript):
// no script copies the stored request, and none copies an answer more than
// once (Lua hashes every byte of each string it makes, see scripts.go).
// Records of earlier versions are hashes (see legacy.go); every script
// reads both.

// recordLayout is the first byte of a record in this layout. A later layout
// gets another byte, and the scripts refuse a record they cannot read.
// labelLayout is the same layout with a scope label after the request:
// only records with a label are written in it, so that processes of the
// previous version, which know layout 1 alone, read every record of a
// deployment that sets no labels (a rolling upgrade).
const (
	recordLayout = 1
	labelLayout  = 2
)

// Offsets in the layout above that the Go side reads.
const (
	offState      = 1
	offLeaseUntil = 3
	offCreatedAt  = 11
	offExpiresAt  = 19
	offUpdatedAt  = 27
	fixedHead     = 51 // where the token's length starts
)

// callIDLen is the size of a call id (see resend.go).
const callIDLen = 16

// stateBytes are the states as the layout keeps them.
var stateBytes = map[byte]idemstore.State{
	'p': idemstore.StatePending,
	'c': idemstore.StateCompleted,
	'r': idemstore.StateNeedsReview,
}

// pendingTail returns what follows the first 35 bytes of a new pending
// record: no call id, then the token, the key's parts, the fingerprint
// and the encoded request, the label when there is one (labelLayout), and
// an empty reason. The reserve script puts the layout byte, the state, the
// flags and the times in front of it.
func pendingTail(k idemstore.Key, token, fp string, req []byte, label string) []byte {
	fields := [...]string{token, k.Operation, k.Scope, k.Key, fp}
	size := callIDLen + 4*(len(fields)+3) + len(req) + len(label)
	for _, f := range fields {
		size += len(f)
	}
	b := make([]byte, callIDLen, size)
	for _, f := range fields {
		b = binary.BigEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(req)))
	b = append(b, req...)
	if label != "" {
		b = binary.BigEndian.AppendUint32(b, uint32(len(label)))
		b = append(b, label...)
	}
	return binary.BigEndian.AppendUint32(b, 0) // no reason
}

// errCorruptRecord is returned for bytes that are not a record in the
// layout above.
var errCorruptRecord = errors.New("idemredis: corrupt record")

// reader takes a record apart field by field; the first short read makes
// every later one fail.
type reader struct {
	b   string
	err error
}

func (r *reader) next(n int) string {
	if r.err != nil || n < 0 || n > len(r.b) {
		r.err = errCorruptRecord
		return ""
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// field reads a 4-byte length and that many bytes.
func (r *reader) field() string {
	l := r.next(4)
	if r.err != nil {
		return ""
	}
	n := uint64(be32(l))
	if n > uint64(len(r.b)) {
		r.err = errCorruptRecord
		return ""
	}
	return r.next(int(n))
}

// be32 and be64 read a big-endian integer at the start of s.
func be32(s string) uint32 {
	return uint32(s[0])<<24 | uint32(s[1])<<16 | uint32(s[2])<<8 | uint32(s[3])
}

func be64(s string) uint64 { return uint64(be32(s))<<32 | uint64(be32(s[4:])) }

// head is what the fixed part of a record and its token say.
type head struct {
	layout     byte
	state      idemstore.State
	leaseUntil time.Time
	createdAt  time.Time
	expiresAt  time.Time
	updatedAt  time.Time
}

// readHead decodes the first 51 bytes of a record.
func readHead(r *reader) (head, error) {
	fixed := r.next(fixedHead)
	if r.err != nil {
		return head{}, fmt.Errorf("%w: %d bytes", errCorruptRecord, len(r.b))
	}
	if fixed[0] != recordLayout && fixed[0] != labelLayout {
		return head{}, fmt.Errorf("idemredis: record of unknown layout %d", fixed[0])
	}
	st, ok := stateBytes[fixed[offState]]
	if !ok {
		return head{}, fmt.Errorf("%w: state %q", errCorruptRecord, fixed[offState])
	}
	at := func(off int) time.Time {
		us := int64(be64(fixed[off:]))
		if us == 0 {
			return time.Time{}
		}
		return time.UnixMicro(us).UTC()
	}
	return head{
		layout:     fixed[0],
		state:      st,
		leaseUntil: at(offLeaseUntil),
		createdAt:  at(offCreatedAt),
		expiresAt:  at(offExpiresAt),
		updatedAt:  at(offUpdatedAt),
	}, nil
}

// decodeRecord decodes a whole record read at readAt.
func decodeRecord(b string, readAt time.Time) (*idemstore.Record, error) {
	return decodeRecordInline(b, readAt, 0)
}

// decodeRecordInline decodes a record read at readAt whose answer, of
// size bytes, was left out of b when size is positive (readInline in
// scripts.go): b then ends where the answer would start, and the record
// says the answer's size instead (idemstore.Record.ResponseSize).
func decodeRecordInline(b string, readAt time.Time, size int64) (*idemstore.Record, error) {
	r := &reader{b: b}
	h, err := readHead(r)
	if err != nil {
		return nil, err
	}
	rec := &idemstore.Record{
		State:      h.state,
		LeaseUntil: h.leaseUntil,
		CreatedAt:  h.createdAt,
		ExpiresAt:  h.expiresAt,
		UpdatedAt:  h.updatedAt,
		ReadAt:     readAt,
	}
	rec.Token = r.field()
	rec.Key.Operation = r.field()
	rec.Key.Scope = r.field()
	rec.Key.Key = r.field()
	rec.Fingerprint = r.field()
	req := r.field()
	if h.layout == labelLayout {
		rec.ScopeLabel = r.field()
	}
	rec.Reason = r.field()
	if r.err != nil {
		return nil, r.err
	}
	if rec.Request, err = idemstore.DecodeRequest([]byte(req)); err != nil {
		return nil, err
	}
	if size > 0 {
		if rec.State != idemstore.StateCompleted || r.b != "" {
			return nil, fmt.Errorf("%w: an answer of %d bytes left out of a %s record", errCorruptRecord, size, rec.State)
		}
		rec.ResponseSize = size
		return rec, nil
	}
	if rec.Response, err = idemstore.DecodeResponse([]byte(r.b)); err != nil {
		return nil, err
	}
	if rec.State == idemstore.StateCompleted && rec.Response == nil {
		// Every completed record ends with its answer: this one was cut.
		return nil, fmt.Errorf("%w: completed without an answer", errCorruptRecord)
	}
	return rec, nil
}

// summaryOf decodes the state, lease deadline and operation of a record
// from its first bytes. ok is false when prefix ends before the
// operation does.
func summaryOf(prefix string) (sum summary, ok bool, err error) {
	r := &reader{b: prefix}
	h, err := readHead(r)
	if err != nil {
		return summary{}, false, err
	}
	r.field() // the token
	op := r.field()
	if r.err != nil {
		return summary{}, false, nil
	}
	return summary{state: h.state, leaseUntil: h.leaseUntil, operation: op}, true, nil
}

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

// decodeRead decodes the reply of the get and reserve scripts: the server's
// TIME in Unix microseconds, then the record (empty when there is none),
// then the size of an answer left out of it (0 when none was). It returns
// (nil, nil) for a missing record.
func decodeRead(vals []rueidis.RedisMessage) (*idemstore.Record, error) {
	if len(vals) != 3 {
		return nil, fmt.Errorf("idemredis: read returned %d values, want 3", len(vals))
	}
	size, err := vals[2].AsInt64()
	if err != nil || size < 0 {
		return nil, fmt.Errorf("idemredis: bad size of an answer left out: %v", err)
	}
	now, _ := vals[0].ToString()
	readAt, err := parseMicros(now)
	if err != nil || readAt.IsZero() {
		return nil, fmt.Errorf("idemredis: bad server time %q", now)
	}
	b, _ := vals[1].ToString()
	if b == "" {
		return nil, nil
	}
	return decodeRecordInline(b, readAt, size)
}

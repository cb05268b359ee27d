package idemmem

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"

	"github.com/idem-dev/idem/idemstore"
)

var _ idemstore.Store = (*Store)(nil)
var _ idemstore.Notifier = (*Store)(nil)
var _ idemstore.ResponseReader = (*Store)(nil)
var _ idemstore.HeadReader = (*Store)(nil)

// ErrFull is returned by Reserve of a new key when the store is at
// Config.MaxRecords or Config.MaxBytes and holds no completed record it
// could evict to make room: every record is pending or needs review (or the
// new record alone is larger than MaxBytes). Nothing is written. It wraps
// idemstore.ErrFull, and so idemstore.ErrUnavailable: the engine fails
// closed (HTTP 503) instead of running the operation unguarded.
var ErrFull = fmt.Errorf("idemmem: no room for a new record: %w", idemstore.ErrFull)

// ErrClosed is returned by every method after Close. It wraps
// idemstore.ErrUnavailable.
var ErrClosed = fmt.Errorf("idemmem: store is closed: %w", idemstore.ErrUnavailable)

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// Shards is the number of independently locked partitions; it is
	// rounded up to a power of two. Defaults to 64.
	Shards int
	// MaxRecords caps how many records the store holds, in every state.
	// At the cap, a Reserve of a new key first evicts completed records,
	// those whose retention ends soonest first (with one retention for every
	// operation: the oldest), and fails with ErrFull when only pending and
	// needs_review records are left; those are never evicted. Defaults to
	// DefaultMaxRecords; a negative value means no cap.
	//
	// A completed record evicted before its retention ends no longer guards
	// its key: a retry that comes later runs the operation again. Size the
	// bounds for the retention window (records completed per second times
	// Retention), and watch Usage().Evicted.
	//
	// New makes the store's index for MaxRecords records up front (for
	// at most 262 144), so that it does not grow as the store fills: about
	// 2 MiB at the default, at most about 9 MiB.
	MaxRecords int
	// MaxBytes caps the memory the records take, as the store counts it:
	// each record's scope, operation, key, fingerprint, token, reason and label,
	// the request kept for operators (method, path, query and body), the
	// stored answer encoded (status, every header name and value, and the
	// body), and RecordOverhead for the rest. A new record is admitted only
	// within it, evicting completed records as at MaxRecords. What a record
	// grows by later is never refused, since it records what happened:
	// Complete first evicts to make room for its answer, but while only
	// pending and needs_review records are left it stores the answer all
	// the same, and a review's reason is kept as given. The store can then
	// hold more than MaxBytes, by about the answers being completed at that
	// moment, until evictions bring it back under; new keys get ErrFull
	// meanwhile. Defaults to DefaultMaxBytes; a negative value means no cap.
	MaxBytes int64
	// Now is the store's clock: every lease deadline, creation and expiry
	// time is taken from it, and every expiry judged by it. Defaults to
	// time.Now. Tests inject a fake clock here.
	Now func() time.Time
}

// The bounds a Store has unless Config sets others: 100,000 records, a
// day's retention of one new key a second with room to spare, and 256 MiB,
// room for that many records with answers of about 2 KiB each while staying
// a modest share of a small container's memory.
const (
	DefaultMaxRecords = 100_000
	DefaultMaxBytes   = 256 << 20
)

// MinMaxBytes is the smallest positive MaxBytes accepted: room for a few
// records.
const MinMaxBytes = 4 * RecordOverhead

func (c Config) withDefaults() Config {
	if c.Shards == 0 {
		c.Shards = 64
	}
	if c.MaxRecords == 0 {
		c.MaxRecords = DefaultMaxRecords
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Shards > 0 {
		n := 1
		for n < c.Shards {
			n <<= 1
		}
		c.Shards = n
	}
	return c
}

func (c Config) validate() error {
	if c.Shards < 1 || c.Shards > 1<<16 {
		return fmt.Errorf("idemmem: Shards = %d, want 1..65536", c.Shards)
	}
	if c.MaxBytes > 0 && c.MaxBytes < MinMaxBytes {
		return fmt.Errorf("idemmem: MaxBytes = %d is too small to hold a few records; want at least %d, or a negative value for no cap", c.MaxBytes, MinMaxBytes)
	}
	return nil
}

// Store is an in-memory idemstore.Store. It is safe for concurrent use.
type Store struct {
	cfg    Config
	seed   maphash.Seed
	shards []shard
	mask   uint64
	closed atomic.Bool

	// The bounds, math.MaxInt64 for none, and what the store holds against
	// them (see bound.go).
	maxRecords, maxBytes int64
	count, bytes         atomic.Int64
	evicted              atomic.Int64
}

// shard is one locked partition of the store.
type shard struct {
	mu     sync.Mutex
	recs   map[uint64]*entry // by key hash; see table.go
	n      int               // records in recs
	expiry expiryQueue
	// head is the earliest expiry queued, in Unix nanoseconds, or
	// math.MaxInt64: read without the lock to find the shard whose record
	// is evicted first when the store needs room.
	head    atomic.Int64
	waiters map[idemstore.Key][]chan struct{}
	// The search indexes (see table.go).
	byKey     *btree.BTreeG[keyItem]
	unindexed []*entry           // records not yet in byKey (see syncKeyIndex)
	lastReq   *idemstore.Request // see keepRequest
	byLabel   map[string]map[*entry]struct{}
	_         [64]byte // keep neighbouring shards' locks off one cache line
}

// New returns an empty Store. It fails only when cfg is invalid.
func New(cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, seed: maphash.MakeSeed(), shards: make([]shard, cfg.Shards), mask: uint64(cfg.Shards - 1),
		maxRecords: bound(int64(cfg.MaxRecords)), maxBytes: bound(cfg.MaxBytes)}
	hint := 0
	if cfg.MaxRecords > 0 {
		hint = min(min(cfg.MaxRecords, maxStoreHint)/cfg.Shards, maxShardHint)
	}
	for i := range s.shards {
		s.shards[i].recs = make(map[uint64]*entry, hint)
		s.shards[i].head.Store(math.MaxInt64)
	}
	return s, nil
}

// maxShardHint and maxStoreHint bound the records a shard's map, and all
// of them together, are made for up front: a map made for its share of
// MaxRecords does not grow (and copy itself) as the store fills, but a
// large MaxRecords, or many shards, must not cost their memory before any
// record comes (about 9 MiB at most).
const (
	maxShardHint = 4096
	maxStoreHint = 64 * maxShardHint
)

// MustNew is New for configurations known to be valid, such as the zero
// Config. It panics on an invalid one.
func MustNew(cfg Config) *Store {
	s, err := New(cfg)
	if err != nil {
		panic(err)
	}
	return s
}

// Close makes every later call fail with ErrClosed and drops the records.
// Waiters are woken. Close is idempotent.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		clear(sh.recs)
		sh.clearIndexes()
		sh.lastReq = nil
		sh.n = 0
		sh.expiry = expiryQueue{}
		sh.syncHead()
		for k := range sh.waiters {
			sh.wake(k)
		}
		sh.mu.Unlock()
	}
	s.count.Store(0)
	s.bytes.Store(0)
	return nil
}

// Len returns the number of records held, expired ones included until they
// are evicted.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.n
		sh.mu.Unlock()
	}
	return n
}

// Capabilities reports that the store can notify waiters and search.
func (s *Store) Capabilities() idemstore.Capabilities {
	return idemstore.Capabilities{Notify: true, Search: true}
}

// locate returns the shard that holds k and k's hash, by which the shard
// indexes it.
func (s *Store) locate(k idemstore.Key) (*shard, uint64) {
	h := maphash.Comparable(s.seed, k)
	return &s.shards[h&s.mask], h
}

// check returns the error every method reports before touching state.
func (s *Store) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return ErrClosed
	}
	return nil
}

// now is the store's clock, in UTC.
func (s *Store) now() time.Time { return s.cfg.Now().UTC() }

// entry is a stored record. A completed record keeps its answer encoded
// (idemstore.EncodeResponse) in resp rather than as a Response with a
// header map: one pointer-free block that the garbage collector need not
// scan, which matters when a store holds a day of answers.
type entry struct {
	rec  record
	resp []byte
	// req is the request kept for operators, or nil; never changed, so
	// records may share one (see shard.keepRequest).
	req  *idemstore.Request
	next *entry // the next record whose key has the same hash
	size int64  // what the record counts against MaxBytes
	// unindexedAt is the record's place in its shard's unindexed, plus
	// one; zero once it is in the key index.
	unindexedAt int32
}

// expired reports whether e is a completed record that may be evicted at
// now.
func expired(e *entry, now time.Time) bool {
	if e.rec.State != idemstore.StateCompleted {
		return false
	}
	exp := e.rec.ExpiresAt()
	return !exp.IsZero() && !exp.After(now)
}

// Reserve inserts a pending record for p.Key unless one exists, in which
// case it returns a copy of that record and created == false. A completed
// record whose retention has ended counts as absent. At Config.MaxRecords
// or Config.MaxBytes, a new key's Reserve evicts completed records to make
// room, and fails with ErrFull if none is left to evict; a Reserve that
// finds its key's record never needs room.
func (s *Store) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	if err := s.check(ctx); err != nil {
		return nil, false, err
	}
	now := s.now()
	size := reserveSize(&p)
	for attempt := int64(1); ; attempt++ {
		rec, created, full := s.reserve(p, now, size)
		if !full {
			return rec, created, nil
		}
		// Concurrent reservations may take the room made for this one:
		// each retry makes room for one more record, so that it soon
		// finds some. It ends when nothing is left to evict.
		if size > s.maxBytes || !s.makeRoom(min(attempt, maxRoomAhead, s.maxRecords, s.maxBytes/size), size, now) {
			return nil, false, ErrFull
		}
	}
}

// maxRoomAhead bounds how many records' room a Reserve retrying under
// contention makes.
const maxRoomAhead = 8

// reserve is one attempt of Reserve under the shard lock. full reports that
// the bounds stopped it.
func (s *Store) reserve(p idemstore.ReserveParams, now time.Time, size int64) (rec *idemstore.Record, created, full bool) {
	sh, h := s.locate(p.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	// Every completed record's expiry is queued, so after this no record
	// that expired at or before now is left to find.
	sh.evictExpired(s, now)
	if old := sh.lookup(h, p.Key); old != nil {
		return copyRecordInline(old, now, p.InlineResponse), false, false
	}
	if !s.admit(size) {
		return nil, false, true
	}
	e := &entry{size: size, rec: record{
		Key:         p.Key,
		Fingerprint: p.Fingerprint,
		State:       idemstore.StatePending,
		Token:       p.Token,
		ScopeLabel:  p.ScopeLabel,
	}}
	e.rec.setLeaseUntil(now.Add(p.Lease))
	e.rec.setCreatedAt(now)
	e.rec.setUpdatedAt(now)
	if p.Request != nil {
		e.req = sh.keepRequest(p.Request)
	}
	sh.insert(h, e)
	return nil, true, false
}

// keepRequest returns the store's own copy of q, a record's request kept
// for operators. A request without a body that equals the one the shard
// kept last is that one, shared: calls of one method keep the same
// request (gRPC's front doors keep its name only), and each record then
// holds a pointer to it instead of a copy. The caller holds sh.mu.
func (sh *shard) keepRequest(q *idemstore.Request) *idemstore.Request {
	if last := sh.lastReq; last != nil && len(q.Body) == 0 &&
		q.Method == last.Method && q.Path == last.Path && q.Query == last.Query {
		return last
	}
	c := *q
	c.Body = clone(q.Body)
	if len(c.Body) == 0 {
		sh.lastReq = &c
	}
	return &c
}

// Get returns a copy of the record for key, or idemstore.ErrNotFound.
func (s *Store) Get(ctx context.Context, key idemstore.Key) (*idemstore.Record, error) {
	return s.GetHead(ctx, key, 0)
}

// GetHead is Get with an answer longer than inline bytes (when positive)
// left out (see idemstore.HeadReader).
func (s *Store) GetHead(ctx context.Context, key idemstore.Key, inline int) (*idemstore.Record, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	sh, h := s.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.lookup(h, key)
	if e == nil {
		return nil, idemstore.ErrNotFound
	}
	return copyRecordInline(e, s.now(), inline), nil
}

// ReadResponse returns the answer of the record for key while it is
// completed under token and its retention has not ended; otherwise
// idemstore.ErrNotFound (see idemstore.ResponseReader). The answer is
// decoded outside the shard's lock: the encoded bytes of a completed
// record never change.
func (s *Store) ReadResponse(ctx context.Context, key idemstore.Key, token string) (*idemstore.Response, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	sh, h := s.locate(key)
	sh.mu.Lock()
	e := sh.lookup(h, key)
	var b []byte
	if e != nil && e.rec.State == idemstore.StateCompleted && e.rec.Token == token && !expired(e, s.now()) {
		b = e.resp
	}
	sh.mu.Unlock()
	if b == nil {
		return nil, idemstore.ErrNotFound
	}
	return decodeResponse(b), nil
}

// drop deletes e, whose key hashes to h, and reports whether it was still
// there. The caller holds sh.mu.
func (sh *shard) drop(s *Store, h uint64, e *entry) bool {
	if !sh.remove(h, e) {
		return false
	}
	s.count.Add(-1)
	s.bytes.Add(-e.size)
	return true
}

// errResolveNoResponse is returned by Resolve with ResolveComplete and no
// response.
var errResolveNoResponse = errors.New("idemmem: Resolve with ResolveComplete needs a response")

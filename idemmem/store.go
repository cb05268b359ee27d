package idemmem

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

var _ idemstore.Store = (*Store)(nil)
var _ idemstore.Notifier = (*Store)(nil)

// ErrFull is returned by Reserve when the store holds Config.MaxRecords
// records and none of them has expired. It wraps idemstore.ErrUnavailable,
// so the engine fails closed instead of running the operation unguarded.
var ErrFull = fmt.Errorf("idemmem: store is full: %w", idemstore.ErrUnavailable)

// ErrClosed is returned by every method after Close. It wraps
// idemstore.ErrUnavailable.
var ErrClosed = fmt.Errorf("idemmem: store is closed: %w", idemstore.ErrUnavailable)

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// Shards is the number of independently locked partitions; it is
	// rounded up to a power of two. Defaults to 64.
	Shards int
	// MaxRecords caps how many records the store holds. When it is reached,
	// Reserve evicts expired records and otherwise fails with ErrFull; it
	// never evicts a pending, needs_review or unexpired completed record.
	// Defaults to 0, no cap.
	MaxRecords int
	// Now is the store's clock: every lease deadline, creation and expiry
	// time is taken from it, and every expiry judged by it. Defaults to
	// time.Now. Tests inject a fake clock here.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.Shards == 0 {
		c.Shards = 64
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
	if c.MaxRecords < 0 {
		return fmt.Errorf("idemmem: MaxRecords = %d, want >= 0", c.MaxRecords)
	}
	return nil
}

// Store is an in-memory idemstore.Store. It is safe for concurrent use.
type Store struct {
	cfg    Config
	seed   maphash.Seed
	shards []shard
	mask   uint64
	count  atomic.Int64 // records held; maintained only with MaxRecords
	closed atomic.Bool
}

// shard is one locked partition of the store.
type shard struct {
	mu      sync.Mutex
	recs    map[uint64]*entry // by key hash; see table.go
	n       int               // records in recs
	expiry  expiryQueue
	waiters map[idemstore.Key][]chan struct{}
	_       [64]byte // keep neighbouring shards' locks off one cache line
}

// New returns an empty Store. It fails only when cfg is invalid.
func New(cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, seed: maphash.MakeSeed(), shards: make([]shard, cfg.Shards), mask: uint64(cfg.Shards - 1)}
	for i := range s.shards {
		s.shards[i].recs = make(map[uint64]*entry)
	}
	return s, nil
}

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
		sh.n = 0
		sh.expiry = expiryQueue{}
		for k := range sh.waiters {
			sh.wake(k)
		}
		sh.mu.Unlock()
	}
	s.count.Store(0)
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

// Capabilities reports that the store can notify waiters.
func (s *Store) Capabilities() idemstore.Capabilities {
	return idemstore.Capabilities{Notify: true}
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
	rec  idemstore.Record // Response and Request are always nil here
	resp []byte
	req  idemstore.Request // valid when hasReq
	next *entry            // the next record whose key has the same hash

	hasReq bool
}

// expired reports whether e is a completed record that may be evicted at
// now.
func expired(e *entry, now time.Time) bool {
	return e.rec.State == idemstore.StateCompleted && !e.rec.ExpiresAt.IsZero() && !e.rec.ExpiresAt.After(now)
}

// Reserve inserts a pending record for p.Key unless one exists, in which
// case it returns a copy of that record and created == false. A completed
// record whose retention has ended counts as absent. With Config.MaxRecords
// reached, Reserve evicts what expired in every shard and fails with ErrFull
// if that frees nothing.
func (s *Store) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	if err := s.check(ctx); err != nil {
		return nil, false, err
	}
	now := s.now()
	rec, created, full := s.reserve(p, now)
	if full {
		s.evictAll(now)
		if rec, created, full = s.reserve(p, now); full {
			return nil, false, ErrFull
		}
	}
	return rec, created, nil
}

// reserve is one attempt of Reserve under the shard lock. full reports that
// the record cap stopped it.
func (s *Store) reserve(p idemstore.ReserveParams, now time.Time) (rec *idemstore.Record, created, full bool) {
	sh, h := s.locate(p.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	// Every completed record's expiry is queued, so after this no record
	// that expired at or before now is left to find.
	sh.evictExpired(s, now)
	if old := sh.lookup(h, p.Key); old != nil {
		return copyRecord(old, now), false, false
	}
	if s.cfg.MaxRecords > 0 {
		if s.count.Add(1) > int64(s.cfg.MaxRecords) {
			s.count.Add(-1)
			return nil, false, true
		}
	}
	e := &entry{rec: idemstore.Record{
		Key:         p.Key,
		Fingerprint: p.Fingerprint,
		State:       idemstore.StatePending,
		Token:       p.Token,
		LeaseUntil:  now.Add(p.Lease),
		CreatedAt:   now,
		UpdatedAt:   now,
	}}
	if p.Request != nil {
		e.req, e.hasReq = *p.Request, true
		e.req.Body = clone(p.Request.Body)
	}
	sh.insert(h, e)
	return nil, true, false
}

// evictAll evicts expired completed records from every shard.
func (s *Store) evictAll(now time.Time) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.evictExpired(s, now)
		sh.mu.Unlock()
	}
}

// Get returns a copy of the record for key, or idemstore.ErrNotFound.
func (s *Store) Get(ctx context.Context, key idemstore.Key) (*idemstore.Record, error) {
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
	return copyRecord(e, s.now()), nil
}

// drop deletes e, whose key hashes to h, and reports whether it was still
// there. The caller holds sh.mu.
func (sh *shard) drop(s *Store, h uint64, e *entry) bool {
	if !sh.remove(h, e) {
		return false
	}
	if s.cfg.MaxRecords > 0 {
		s.count.Add(-1)
	}
	return true
}

// errResolveNoResponse is returned by Resolve with ResolveComplete and no
// response.
var errResolveNoResponse = errors.New("idemmem: Resolve with ResolveComplete needs a response")

package storeurl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// lazy is a store that connects in the background. Until the backend
// answers (and is migrated), every call fails with ErrUnavailable; after
// that, calls go straight to the real store.
type lazy struct {
	t    *Target
	opts Options

	inner   atomic.Pointer[idemstore.Store]
	lastErr atomic.Pointer[error]
	closeFn func() error // set once inner is

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
}

var (
	_ idemstore.Store          = (*lazy)(nil)
	_ idemstore.Notifier       = (*lazy)(nil)
	_ idemstore.BatchReporter  = (*lazy)(nil)
	_ idemstore.ResponseReader = (*lazy)(nil)
	_ idemstore.HeadReader     = (*lazy)(nil)
)

func newLazy(t *Target, opts Options) *lazy {
	ctx, cancel := context.WithCancel(context.Background())
	l := &lazy{t: t, opts: opts, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	err := error(errNotYet)
	l.lastErr.Store(&err)
	// The first attempt is made before returning, so that a store that is
	// up (a local SQLite file, a reachable server) serves the very first
	// request; it is bounded, so that a store that is down does not hold up
	// the start.
	if l.attempt(ctx, firstAttemptTimeout) {
		close(l.done)
		return l
	}
	l.opts.Logger.Warn("store unreachable; protected requests get 503 until it answers",
		slog.String("store", t.Redacted), slog.Any("error", *l.lastErr.Load()))
	go l.connectLoop()
	return l
}

// firstAttemptTimeout bounds the connection attempt made by Open.
const firstAttemptTimeout = 3 * time.Second

// attempt tries to connect once; it reports success.
func (l *lazy) attempt(parent context.Context, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	s, closeFn, err := l.t.Connect(ctx, l.opts.Migrate)
	if err != nil {
		l.lastErr.Store(&err)
		return false
	}
	l.mu.Lock()
	l.closeFn = closeFn
	l.mu.Unlock()
	l.inner.Store(&s)
	return true
}

var errNotYet = errors.New("not connected yet")

func (l *lazy) connectLoop() {
	defer close(l.done)
	pause := 100 * time.Millisecond
	for attempt := 2; ; attempt++ {
		select {
		case <-l.ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, l.opts.RetryInterval)
		if l.attempt(l.ctx, 10*time.Second) {
			l.opts.Logger.Info("store reachable", slog.String("store", l.t.Redacted), slog.Int("attempts", attempt))
			return
		}
		if l.ctx.Err() != nil {
			return
		}
	}
}

func (l *lazy) close() error {
	l.cancel()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closeFn != nil {
		return l.closeFn()
	}
	return nil
}

// get returns the connected store, or an error wrapping ErrUnavailable.
func (l *lazy) get(ctx context.Context) (idemstore.Store, error) {
	if p := l.inner.Load(); p != nil {
		return *p, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	last := *l.lastErr.Load()
	if errors.Is(last, idemstore.ErrUnavailable) {
		return nil, last
	}
	return nil, fmt.Errorf("%w: store %s: %v", idemstore.ErrUnavailable, l.t.Redacted, last)
}

func (l *lazy) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	s, err := l.get(ctx)
	if err != nil {
		return nil, false, err
	}
	return s.Reserve(ctx, p)
}

func (l *lazy) Get(ctx context.Context, key idemstore.Key) (*idemstore.Record, error) {
	s, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return s.Get(ctx, key)
}

// ReadResponse reads through the real store's ReadResponse, or its Get
// (idemstore.ReadResponse).
func (l *lazy) ReadResponse(ctx context.Context, key idemstore.Key, token string) (*idemstore.Response, error) {
	s, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return idemstore.ReadResponse(ctx, s, key, token)
}

// GetHead reads through the real store's GetHead, or its Get
// (idemstore.GetHead).
func (l *lazy) GetHead(ctx context.Context, key idemstore.Key, inline int) (*idemstore.Record, error) {
	s, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return idemstore.GetHead(ctx, s, key, inline)
}

func (l *lazy) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	s, err := l.get(ctx)
	if err != nil {
		return err
	}
	return s.Complete(ctx, p)
}

func (l *lazy) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	s, err := l.get(ctx)
	if err != nil {
		return err
	}
	return s.Release(ctx, p)
}

func (l *lazy) Delete(ctx context.Context, p idemstore.DeleteParams) error {
	s, err := l.get(ctx)
	if err != nil {
		return err
	}
	return s.Delete(ctx, p)
}

func (l *lazy) Escalate(ctx context.Context, p idemstore.EscalateParams) error {
	s, err := l.get(ctx)
	if err != nil {
		return err
	}
	return s.Escalate(ctx, p)
}

func (l *lazy) Extend(ctx context.Context, p idemstore.ExtendParams) error {
	s, err := l.get(ctx)
	if err != nil {
		return err
	}
	return s.Extend(ctx, p)
}

func (l *lazy) Takeover(ctx context.Context, p idemstore.TakeoverParams) error {
	s, err := l.get(ctx)
	if err != nil {
		return err
	}
	return s.Takeover(ctx, p)
}

func (l *lazy) Resolve(ctx context.Context, p idemstore.ResolveParams) error {
	s, err := l.get(ctx)
	if err != nil {
		return err
	}
	return s.Resolve(ctx, p)
}

func (l *lazy) ListExpiredLeases(ctx context.Context, limit int) ([]*idemstore.Record, error) {
	s, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return s.ListExpiredLeases(ctx, limit)
}

func (l *lazy) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	s, err := l.get(ctx)
	if err != nil {
		return idemstore.ListPage{}, err
	}
	return s.List(ctx, p)
}

func (l *lazy) Purge(ctx context.Context, p idemstore.PurgeParams) (int, error) {
	s, err := l.get(ctx)
	if err != nil {
		return 0, err
	}
	return s.Purge(ctx, p)
}

// Counts forwards to the connected store when it counts
// (idemstore.Counter); another store's answer wraps
// idemstore.ErrSearchUnsupported.
func (l *lazy) Counts(ctx context.Context) (idemstore.Counts, error) {
	s, err := l.get(ctx)
	if err != nil {
		return idemstore.Counts{}, err
	}
	c, ok := s.(idemstore.Counter)
	if !ok {
		return idemstore.Counts{}, fmt.Errorf("%w: store %s does not count keys", idemstore.ErrSearchUnsupported, l.t.Redacted)
	}
	return c.Counts(ctx)
}

// Capabilities reports what the named store can do, known from the URL, so
// that the engine can rely on it before the store connects.
func (l *lazy) Capabilities() idemstore.Capabilities { return l.t.Capabilities() }

// BatchStats forwards to the connected store; ok is false before it
// connects and for a store that does not batch.
func (l *lazy) BatchStats() (idemstore.BatchStats, bool) {
	p := l.inner.Load()
	if p == nil {
		return idemstore.BatchStats{}, false
	}
	r, ok := (*p).(idemstore.BatchReporter)
	if !ok {
		return idemstore.BatchStats{}, false
	}
	return r.BatchStats()
}

// Subscribe forwards to the connected store when it notifies.
func (l *lazy) Subscribe(ctx context.Context, key idemstore.Key) (<-chan struct{}, func(), error) {
	s, err := l.get(ctx)
	if err != nil {
		return nil, nil, err
	}
	n, ok := s.(idemstore.Notifier)
	if !ok || !s.Capabilities().Notify {
		return nil, nil, errors.New("storeurl: the store does not notify")
	}
	return n.Subscribe(ctx, key)
}

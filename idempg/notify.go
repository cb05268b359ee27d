package idempg

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/idemstore"
)

// notifyPayload is the NOTIFY payload for k: a hash of the key, so that
// payloads stay short and carry no client data. Collisions only cause a
// spurious wake-up, which waiters tolerate (they read the record again).
func notifyPayload(k idemstore.Key) string {
	return strconv.FormatUint(keyHash(k), 16)
}

func keyHash(k idemstore.Key) uint64 {
	h := fnv.New64a()
	for _, part := range [3]string{k.Scope, k.Operation, k.Key} {
		h.Write([]byte(strconv.Itoa(len(part))))
		h.Write([]byte{':'})
		h.Write([]byte(part))
	}
	return h.Sum64()
}

// Subscribe returns a channel that receives a value after the record for
// key may have changed (completed, released, escalated, resolved or taken
// over), and also whenever the listening connection drops, so that waiters
// fall back to reading the record. The caller must call cancel when done.
//
// The first Subscribe of a Store opens one dedicated connection (with the
// pool's connection settings, outside the pool) and LISTENs on
// Config.Channel. Subscribe returns once that connection listens and the
// key is listed in the waiters table (only listed keys are announced), so
// no change after it returns is missed. Listing the key locks the record's
// row FOR SHARE but never writes it, so a waiter cannot make the holder's
// CompleteTx fail. If the record is no longer pending, the channel is woken
// at once. If the server cannot be reached, Subscribe
// fails with an error wrapping idemstore.ErrUnavailable, and the store
// keeps trying to listen in the background.
func (s *Store) Subscribe(ctx context.Context, key idemstore.Key) (<-chan struct{}, func(), error) {
	if s.cfg.DisableNotify {
		return nil, nil, errors.New("idempg: notifications are disabled (Config.DisableNotify)")
	}
	sub, cancel, err := s.l.subscribe(ctx, keyHash(key))
	if err != nil {
		return nil, nil, err
	}
	var pending int
	if err := (readCommitted{s}).QueryRow(ctx, s.q.markWaiting, key.Scope, key.Operation, key.Key).Scan(&pending); err != nil {
		cancel()
		return nil, nil, interpretError(ctx, err)
	}
	if pending == 0 {
		wake(sub) // not pending (any more): nothing to wait for
	}
	return sub.ch, cancel, nil
}

type listenState int

const (
	stateIdle       listenState = iota // no listening goroutine yet
	stateConnecting                    // opening the connection
	stateListening                     // LISTEN done, notifications flow
	stateFailed                        // the last connection attempt failed
	stateClosed                        // Close was called
)

type subscriber struct{ ch chan struct{} }

// listener owns the one LISTEN connection of a Store and fans notifications
// out to subscribers by key hash.
type listener struct {
	pool     *pgxpool.Pool
	channel  string
	maxPause time.Duration

	mu      sync.Mutex
	state   listenState
	lastErr error
	changed chan struct{} // closed and replaced at every state change
	subs    map[uint64]map[*subscriber]struct{}
	stop    context.CancelFunc
	done    chan struct{}
}

func newListener(pool *pgxpool.Pool, channel string, maxPause time.Duration) *listener {
	return &listener{
		pool:     pool,
		channel:  channel,
		maxPause: maxPause,
		changed:  make(chan struct{}),
		subs:     make(map[uint64]map[*subscriber]struct{}),
	}
}

// setState records a state change and wakes everyone waiting for one. The
// caller holds l.mu.
func (l *listener) setState(st listenState, err error) {
	l.state, l.lastErr = st, err
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *listener) subscribe(ctx context.Context, h uint64) (*subscriber, func(), error) {
	l.mu.Lock()
	if l.state == stateIdle {
		runCtx, stop := context.WithCancel(context.Background())
		l.stop, l.done = stop, make(chan struct{})
		l.setState(stateConnecting, nil)
		go l.run(runCtx)
	}
	for {
		switch l.state {
		case stateClosed:
			l.mu.Unlock()
			return nil, nil, errors.New("idempg: subscribe on a closed store")
		case stateFailed:
			err := l.lastErr
			l.mu.Unlock()
			return nil, nil, err
		case stateListening:
			sub := &subscriber{ch: make(chan struct{}, 1)}
			if l.subs[h] == nil {
				l.subs[h] = make(map[*subscriber]struct{})
			}
			l.subs[h][sub] = struct{}{}
			l.mu.Unlock()
			var once sync.Once
			cancel := func() {
				once.Do(func() {
					l.mu.Lock()
					defer l.mu.Unlock()
					delete(l.subs[h], sub)
					if len(l.subs[h]) == 0 {
						delete(l.subs, h)
					}
				})
			}
			return sub, cancel, nil
		}
		changed := l.changed
		l.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("idempg: subscribe: %w", ctx.Err())
		}
		l.mu.Lock()
	}
}

// run keeps one listening connection open until ctx ends, reconnecting with
// a growing pause after failures.
func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	pause := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := l.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		l.mu.Lock()
		if l.state == stateClosed {
			l.mu.Unlock()
			return
		}
		l.setState(stateFailed, interpretError(ctx, err))
		l.wakeAll() // notifications may be lost from here: waiters poll
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, l.maxPause)
		l.mu.Lock()
		if l.state == stateFailed {
			l.setState(stateConnecting, nil)
		}
		l.mu.Unlock()
	}
}

// listenOnce opens the connection, LISTENs and dispatches notifications
// until the connection fails or ctx ends.
func (l *listener) listenOnce(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, l.pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize()); err != nil {
		return err
	}
	l.mu.Lock()
	if l.state == stateClosed {
		l.mu.Unlock()
		return nil
	}
	l.setState(stateListening, nil)
	// Changes made while no connection listened were not announced.
	l.wakeAll()
	l.mu.Unlock()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		h, err := strconv.ParseUint(n.Payload, 16, 64)
		if err != nil {
			continue
		}
		l.mu.Lock()
		for sub := range l.subs[h] {
			wake(sub)
		}
		l.mu.Unlock()
	}
}

// wakeAll wakes every subscriber. The caller holds l.mu.
func (l *listener) wakeAll() {
	for _, subs := range l.subs {
		for sub := range subs {
			wake(sub)
		}
	}
}

func wake(sub *subscriber) {
	select {
	case sub.ch <- struct{}{}:
	default: // already has a pending wake-up
	}
}

// close stops the listening goroutine, closes its connection and wakes all
// subscribers.
func (l *listener) close() {
	l.mu.Lock()
	if l.state == stateClosed {
		l.mu.Unlock()
		return
	}
	stop, done := l.stop, l.done
	l.setState(stateClosed, nil)
	l.wakeAll()
	l.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

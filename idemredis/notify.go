package idemredis

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// Subscribe returns a channel that receives a value after the record for key
// was completed, released, escalated, taken over, resolved or deleted. The
// scripts that make those changes publish on the record's own channel,
// <prefix>:{<tag>}:n, with SPUBLISH (or PUBLISH with Config.ClassicPubSub),
// so on a Cluster only the node that owns the record's slot carries the
// message.
//
// Most records are never waited for, so the scripts that settle a pending
// record (Complete, Release, Escalate, Takeover) publish only when its
// flags say that someone subscribed: once the server has confirmed the
// subscription, Subscribe marks the pending record (one more script), and a
// settling script reads the mark in the same atomic step as its change.
// When the record is missing or no longer pending at that moment, the
// channel receives a value at once: it changed before the mark could be
// set. Resolve and Delete always publish.
//
// The subscription holds a dedicated connection of its own (rueidis
// Dedicate, to the master of the record's slot on a Cluster), taken from
// the client's pool of blocking connections, and closed by cancel.
// Subscribe returns once the server confirmed the subscription, so a change
// made after it returns is not missed while the connection stays up. When
// the connection breaks, or the server ends the subscription (a Cluster
// node that no longer serves the record's slot does), the channel is
// closed: a notification is a hint, and waiters keep polling. The channel is also closed when ctx ends or
// cancel is called; cancel waits for the subscription's goroutine to stop.
func (s *Store) Subscribe(ctx context.Context, key idemstore.Key) (<-chan struct{}, func(), error) {
	dc, release := s.client.Dedicate()
	var (
		mu     sync.Mutex
		closed bool
	)
	out := make(chan struct{}, 1)
	unsubscribed := make(chan struct{})
	var unsubscribe sync.Once
	hookErrs := dc.SetPubSubHooks(rueidis.PubSubHooks{
		OnMessage: func(rueidis.PubSubMessage) {
			mu.Lock()
			defer mu.Unlock()
			if closed {
				return
			}
			select {
			case out <- struct{}{}:
			default: // a wake-up is already pending
			}
		},
		// A Cluster node unsubscribes the clients of a slot it no longer
		// serves (SUNSUBSCRIBE after a failover or a resharding).
		OnSubscription: func(sub rueidis.PubSubSubscription) {
			if sub.Kind == "sunsubscribe" || sub.Kind == "unsubscribe" {
				unsubscribe.Do(func() { close(unsubscribed) })
			}
		},
	})
	sub := dc.B().Ssubscribe().Channel(s.channel(key)).Build()
	if s.cfg.ClassicPubSub {
		sub = dc.B().Subscribe().Channel(s.channel(key)).Build()
	}
	// The reply to SUBSCRIBE and SSUBSCRIBE is the server's confirmation,
	// so the mark is set after the server subscribed the connection.
	pending, err := s.watch(ctx, dc, sub, key)
	if err != nil {
		dc.Close()
		release()
		return nil, nil, err
	}
	if !pending {
		out <- struct{}{} // changed before it could be marked
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-hookErrs: // the connection broke or was closed
		case <-unsubscribed:
		case <-done:
		case <-ctx.Done():
		}
		mu.Lock()
		closed = true
		close(out)
		mu.Unlock()
	}()
	var once sync.Once
	cancel := func() {
		once.Do(func() {
			close(done)
			<-stopped
			dc.Close()
			release()
		})
	}
	return out, cancel, nil
}

// watch subscribes dc with sub and then marks the record for key as waited
// for. It reports whether the record was pending, and so marked.
func (s *Store) watch(ctx context.Context, dc rueidis.DedicatedClient, sub rueidis.Completed, key idemstore.Key) (bool, error) {
	if err := dc.Do(ctx, sub).Error(); err != nil {
		return false, interpretError(ctx, err)
	}
	msg, err := s.run(ctx, s.scripts().watch, []string{s.recordKey(key)}, nil)
	if err != nil {
		return false, err
	}
	n, err := msg.AsInt64()
	if err != nil {
		return false, fmt.Errorf("idemredis: unexpected reply to a watch: %w", err)
	}
	return n == 1, nil
}

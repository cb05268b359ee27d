package idemredis

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
)

// Subscribe returns a channel that receives a value after the record for key
// was completed, released, escalated, taken over, resolved or deleted. The
// scripts that make those changes publish on the record's own channel,
// <prefix>:{<tag>}:n, with SPUBLISH (or PUBLISH with Config.ClassicPubSub),
// so on a Cluster only the node that owns the record's slot carries the
// message.
//
// Subscribe returns once the subscription is confirmed, so a change made
// after it returns is not missed while the connection stays up. Messages
// sent while a connection is being re-established can be lost: a
// notification is a hint, and waiters keep polling as well. The channel is
// closed when ctx ends or cancel is called; cancel waits for the
// subscription's goroutine to stop.
func (s *Store) Subscribe(ctx context.Context, key idemstore.Key) (<-chan struct{}, func(), error) {
	var ps *redis.PubSub
	if s.cfg.ClassicPubSub {
		ps = s.client.Subscribe(ctx, s.channel(key))
	} else {
		ps = s.client.SSubscribe(ctx, s.channel(key))
	}
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		return nil, nil, interpretError(ctx, err)
	}
	msgs := ps.Channel()
	out := make(chan struct{}, 1)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		defer close(out)
		for {
			select {
			case _, ok := <-msgs:
				if !ok {
					return
				}
				select {
				case out <- struct{}{}:
				default: // a wake-up is already pending
				}
			case <-done:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	var once sync.Once
	cancel := func() {
		once.Do(func() {
			close(done)
			_ = ps.Close()
			<-stopped
		})
	}
	return out, cancel, nil
}

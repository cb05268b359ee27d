package idemstoretest

import (
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// notifyWait bounds how long a test waits for a notification. It is a guard
// against hanging, not a latency requirement.
const notifyWait = 10 * time.Second

func testNotify(t *testing.T, h Harness) {
	s := h.New(t)
	if !s.Capabilities().Notify {
		if _, ok := s.(idemstore.Notifier); ok {
			t.Log("store implements idemstore.Notifier but Capabilities().Notify is false")
		}
		t.Skip("store does not report Capabilities().Notify")
	}
	n, ok := s.(idemstore.Notifier)
	if !ok {
		t.Fatal("Capabilities().Notify is true but the store does not implement idemstore.Notifier")
	}

	changes := []struct {
		name   string
		change func(f *fixture, rec *idemstore.Record) error
	}{
		{"Complete", func(f *fixture, rec *idemstore.Record) error {
			return s.Complete(f.ctx(), idemstore.CompleteParams{Key: rec.Key, Token: rec.Token, Response: jsonResponse(`{}`), Retention: retainLive})
		}},
		{"Release", func(f *fixture, rec *idemstore.Record) error {
			return s.Release(f.ctx(), idemstore.ReleaseParams{Key: rec.Key, Token: rec.Token})
		}},
		{"Escalate", func(f *fixture, rec *idemstore.Record) error {
			return s.Escalate(f.ctx(), idemstore.EscalateParams{Key: rec.Key, Token: rec.Token, Reason: "r"})
		}},
	}
	for _, c := range changes {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, s)
			rec := f.reserve(f.key("k"), leaseLive)
			ch, cancel, err := n.Subscribe(f.ctx(), rec.Key)
			if err != nil {
				t.Fatalf("Subscribe: %v", err)
			}
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- c.change(f, rec) }()
			if err := <-errc; err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			select {
			case <-ch:
			case <-time.After(notifyWait):
				t.Fatalf("no notification within %v after %s", notifyWait, c.name)
			}
		})
	}

	t.Run("AfterCancel", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, s)
		rec := f.reserve(f.key("k"), leaseLive)
		_, cancel, err := n.Subscribe(f.ctx(), rec.Key)
		if err != nil {
			t.Fatalf("Subscribe: %v", err)
		}
		cancel()
		// Changing a record nobody listens to any more must still work.
		if err := s.Release(f.ctx(), idemstore.ReleaseParams{Key: rec.Key, Token: rec.Token}); err != nil {
			t.Fatalf("Release after cancelled subscription: %v", err)
		}
	})
}

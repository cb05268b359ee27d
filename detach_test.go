package idem

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

type ctxKey struct{}

func TestDetachedContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
		cancel() // the client left
		c := detach(parent, time.Second)
		defer c.stop()
		if c.Err() != nil {
			t.Fatalf("Err = %v before the deadline, though the parent was cancelled", c.Err())
		}
		if c.Value(ctxKey{}) != "v" {
			t.Fatal("the parent's values are lost")
		}
		if d, ok := c.Deadline(); !ok || !d.Equal(time.Now().Add(time.Second)) {
			t.Fatalf("Deadline = %v, %v", d, ok)
		}
		done := c.Done()
		select {
		case <-done:
			t.Fatal("Done closed before the deadline")
		default:
		}
		if c.Err() != nil {
			t.Fatal("Err set while Done is open")
		}
		if !c.pause(300*time.Millisecond) || c.pause(time.Hour) {
			t.Fatal("pause: want true within the deadline, false past it")
		}
		<-done // the deadline passes in the bubble's time
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Fatalf("Err = %v after the deadline", c.Err())
		}
	})
}

func TestDetachedContextErrWithoutDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := detach(context.Background(), time.Second)
		defer c.stop()
		if c.Err() != nil { // the first look fixes the deadline
			t.Fatal("Err set at the first look")
		}
		time.Sleep(2 * time.Second) // the bubble's time; nobody asked for Done
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Fatalf("Err = %v past the deadline", c.Err())
		}
		select {
		case <-c.Done():
		default:
			t.Fatal("Done asked for after the deadline is not closed")
		}
	})
}

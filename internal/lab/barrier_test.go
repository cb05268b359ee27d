package lab

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestBarrierOpensWhenAllArrive(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := newBarrier(3)
		var wg sync.WaitGroup
		start := time.Now()
		for range 3 {
			wg.Go(func() {
				ok, err := b.arrive(t.Context())
				if !ok || err != nil {
					t.Errorf("arrive = %v, %v; want true, nil", ok, err)
				}
			})
		}
		wg.Wait()
		if d := time.Since(start); d != 0 {
			t.Errorf("the barrier opened after %v; want at once", d)
		}
	})
}

func TestBarrierOpensOnItsBound(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := newBarrier(2) // the second worker never comes
		start := time.Now()
		ok, err := b.arrive(t.Context())
		if ok || err != nil {
			t.Fatalf("arrive = %v, %v; want false, nil", ok, err)
		}
		if d := time.Since(start); d != barrierBound {
			t.Fatalf("opened after %v; want %v", d, barrierBound)
		}
	})
}

func TestBarrierStopsOnCancel(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		b := newBarrier(2)
		go func() {
			time.Sleep(time.Second)
			cancel()
		}()
		ok, err := b.arrive(ctx)
		if ok || !errors.Is(err, context.Canceled) {
			t.Fatalf("arrive = %v, %v; want false, context.Canceled", ok, err)
		}
	})
}

func TestBarrierOfNoneIsOpen(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		b := newBarrier(0)
		select {
		case <-b.open:
		default:
			t.Fatal("a barrier for no worker is closed")
		}
	})
}

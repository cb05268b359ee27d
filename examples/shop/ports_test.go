package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestDefaultPortsAreFree: without --listen and --provider-listen the shop
// and its provider pick free ports, so two shops run side by side.
func TestDefaultPortsAreFree(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	addrs := make(chan [2]string, 2)
	for i := range 2 {
		dir := t.TempDir()
		var logs bytes.Buffer
		wg.Go(func() {
			err := run(ctx, []string{"--db", filepath.Join(dir, "shop.db"), "--provider-db", filepath.Join(dir, "p.db")}, &logs,
				func(shop, provider string) { addrs <- [2]string{shop, provider} })
			if err != nil && ctx.Err() == nil {
				t.Errorf("shop %d: %v\n%s", i, err, logs.String())
				addrs <- [2]string{}
			}
		})
	}
	a, b := <-addrs, <-addrs
	cancel()
	wg.Wait()
	for _, x := range [][2]string{a, b} {
		for _, addr := range x {
			if !strings.HasPrefix(addr, "127.0.0.1:") || strings.HasSuffix(addr, ":8080") || strings.HasSuffix(addr, ":8081") || strings.HasSuffix(addr, ":0") {
				t.Errorf("address %q, want a free port on loopback", addr)
			}
		}
	}
	if a == b {
		t.Errorf("both shops got %v", a)
	}
}

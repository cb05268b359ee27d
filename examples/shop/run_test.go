package main

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// run serves the shop and its provider on the addresses it is given, and
// stops when its context ends.
func TestRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	addrs := make(chan [2]string, 1)
	done := make(chan error, 1)
	logs := &syncBuffer{}
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--provider-listen", "127.0.0.1:0",
			"--db", filepath.Join(dir, "shop.db"), "--provider-db", filepath.Join(dir, "provider.db")},
			logs, func(shop, provider string) { addrs <- [2]string{shop, provider} })
	}()
	var a [2]string
	select {
	case a = <-addrs:
	case err := <-done:
		t.Fatalf("run: %v\n%s", err, logs)
	}
	for _, url := range []string{"http://" + a[0] + "/", "http://" + a[1] + "/v1/charges"} {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run after cancel: %v", err)
	}
	if !strings.Contains(logs.String(), "shop listening") {
		t.Fatalf("logs: %s", logs)
	}
}

func TestRunRefusesBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--nope"}, {"extra"}, {"--recover-every", "0s"}, {"--db", "postgres://127.0.0.1:1/x?connect_timeout=1", "--provider-db", filepath.Join(t.TempDir(), "p.db"), "--provider-listen", "127.0.0.1:0"}} {
		if err := run(t.Context(), args, io.Discard, nil); err == nil {
			t.Errorf("run %v succeeded", args)
		}
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://idem:secret@127.0.0.1/db": "postgres://idem:xxxxx@127.0.0.1/db",
		"postgres://idem@127.0.0.1/db":        "postgres://idem@127.0.0.1/db",
		"shop.db":                             "shop.db",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q", in, got)
		}
	}
}

package cli

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// listenNotify listens on a unixgram socket, as systemd does at
// $NOTIFY_SOCKET, and sets the variable for the test.
func listenNotify(t *testing.T) *net.UnixConn {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return conn
}

// readNotify reads the next datagram, failing the test after a bound.
func readNotify(t *testing.T, conn *net.UnixConn) string {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 4096)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("no datagram on $NOTIFY_SOCKET: %v", err)
	}
	return string(buf[:n])
}

// TestServeNotifiesSystemd: idem serve sends READY=1 on $NOTIFY_SOCKET
// once its listeners accept connections, and STOPPING=1 when it drains.
func TestServeNotifiesSystemd(t *testing.T) {
	conn := listenNotify(t)
	t.Setenv(storeFileEnv, "")
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer up.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := newServeCmd()
	cmd.SetArgs([]string{"--upstream", up.URL, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--store", "memory://"})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()

	ready := readNotify(t, conn)
	if !strings.HasPrefix(ready, "READY=1\n") || !strings.Contains(ready, "STATUS=listening on 127.0.0.1:") {
		t.Fatalf("first datagram %q; want READY=1 and the STATUS", ready)
	}
	// READY=1 comes once the proxy accepts connections.
	addr := strings.TrimPrefix(ready[strings.Index(ready, "STATUS="):], "STATUS=listening on ")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("READY=1 before the proxy listens on %s: %v", addr, err)
	}
	c.Close()
	cancel()
	if got := readNotify(t, conn); got != "STOPPING=1" {
		t.Errorf("datagram after the context ended %q; want STOPPING=1", got)
	}
	if err := <-done; err != nil {
		t.Errorf("serve: %v", err)
	}
}

func TestSDNotifyRefusesARelativeSocket(t *testing.T) {
	t.Parallel()
	if err := sdNotify("relative.sock", "READY=1"); err == nil {
		t.Error("a relative NOTIFY_SOCKET was accepted")
	}
}

// TestStoreFile: IDEM_STORE_FILE's first line is the store URL, in place of
// the config file's; with --store as well it is an error.
func TestStoreFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "store")
	if err := os.WriteFile(file, []byte("  nosuch://db.internal/idem \nignored\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "idem.yaml")
	if err := os.WriteFile(conf, []byte("upstream: http://127.0.0.1:1\nstore: memory://\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(storeFileEnv, file)
	var f serveFlags
	cmd := newServeCmd()
	fl := cmd.Flags()
	f.config = conf
	cfg, err := f.resolve(fl)
	if err != nil || cfg.Store != "nosuch://db.internal/idem" {
		t.Errorf("store %q, %v; want the file's first line", cfg.Store, err)
	}
	if err := fl.Set("store", "memory://"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.resolve(fl); err == nil || !strings.Contains(err.Error(), "both --store and IDEM_STORE_FILE") {
		t.Errorf("--store and IDEM_STORE_FILE: %v", err)
	}
	if err := os.WriteFile(file, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (&serveFlags{config: conf}).resolve(newServeCmd().Flags()); err == nil || !strings.Contains(err.Error(), "holds no store URL") {
		t.Errorf("an empty store file: %v", err)
	}
}

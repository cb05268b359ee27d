package idemredis

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// Some tests need a Redis of their own, with a small maxmemory, an
// eviction policy or CONFIG disabled, which they must not impose on the
// shared test servers. throwaway starts one.

// redisServerBin is the redis-server the throwaway servers run.
const redisServerBin = "/usr/bin/redis-server"

// needRedisServer skips the test when redis-server is missing, or fails it
// under CI=true.
func needRedisServer(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(redisServerBin); err != nil {
		msg := fmt.Sprintf("%s is missing (apt-get install redis-server): %v", redisServerBin, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// throwaway starts a redis-server on a free loopback port, with no
// persistence and the configuration lines conf (such as "maxmemory 3mb"),
// and returns its address. It is killed when the test ends.
func throwaway(t testing.TB, conf ...string) string {
	t.Helper()
	needRedisServer(t)
	var lastErr error
	for range 3 { // a free port can be taken before the server binds it
		addr, err := startRedis(t, conf)
		if err == nil {
			return addr
		}
		lastErr = err
	}
	t.Fatalf("starting redis-server: %v", lastErr)
	return ""
}

// startRedis makes one attempt of throwaway.
func startRedis(t testing.TB, conf []string) (string, error) {
	port := freePort(t)
	dir := t.TempDir()
	lines := append([]string{
		"bind 127.0.0.1",
		"port " + strconv.Itoa(port),
		`save ""`,
		"appendonly no",
		"dir " + dir,
		`logfile ""`,
	}, conf...)
	if strings.Contains(strings.Join(conf, "\n"), "cluster-enabled yes") {
		lines = append(lines, "cluster-port "+strconv.Itoa(freePort(t)), "cluster-config-file "+filepath.Join(dir, "nodes.conf"))
	}
	path := filepath.Join(dir, "redis.conf")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(redisServerBin, path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The server says when it accepts connections; until then its log
	// goes to the error, if it stops first.
	var log strings.Builder
	scanner := bufio.NewScanner(out)
	ready := false
	for scanner.Scan() {
		log.WriteString(scanner.Text() + "\n")
		if strings.Contains(scanner.Text(), "Ready to accept connections") {
			ready = true
			break
		}
	}
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		_, _ = io.Copy(io.Discard, out)
	}()
	stop := func() {
		_ = cmd.Process.Kill()
		<-drained
		_ = cmd.Wait()
	}
	if !ready {
		stop()
		return "", fmt.Errorf("redis-server stopped before it was ready:\n%s", log.String())
	}
	t.Cleanup(stop)
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// freePort returns a loopback port nothing listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// singleClient connects to the one server at addr (Cluster member or
// not), with rueidis's defaults otherwise.
func singleClient(t testing.TB, addr string, opt rueidis.ClientOption) rueidis.Client {
	t.Helper()
	opt.InitAddress = []string{addr}
	opt.ForceSingleClient = true
	opt.DisableCache = true
	return newClient(t, opt)
}

// configSet runs CONFIG SET name value on c.
func configSet(t testing.TB, c rueidis.Client, name, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue(name, value).Build()).Error(); err != nil {
		t.Fatalf("CONFIG SET %s %s: %v", name, value, err)
	}
}

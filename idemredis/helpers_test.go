package idemredis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"strings"
	"testing"

	"github.com/idem-dev/idem/internal/testenv"

	"github.com/redis/go-redis/v9"
)

// requireEnv returns the server address the test needs; see testenv.Getenv.
func requireEnv(t testing.TB, name string) string {
	t.Helper()
	return testenv.Getenv(t, name)
}

// standaloneClient connects to IDEM_TEST_REDIS_URL.
func standaloneClient(t testing.TB, poolSize int) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(requireEnv(t, "IDEM_TEST_REDIS_URL"))
	if err != nil {
		t.Fatalf("IDEM_TEST_REDIS_URL: %v", err)
	}
	if poolSize > 0 {
		opts.PoolSize = poolSize
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// clusterClient connects to the Cluster seeds in IDEM_TEST_REDIS_CLUSTER.
func clusterClient(t testing.TB, poolSize int) *redis.ClusterClient {
	t.Helper()
	addrs := strings.Split(requireEnv(t, "IDEM_TEST_REDIS_CLUSTER"), ",")
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: poolSize})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testPrefix returns a key prefix no other test uses.
func testPrefix() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "idemtest-" + hex.EncodeToString(b)
}

// newTestStore returns a store under a fresh prefix whose keys are deleted
// when the test ends.
func newTestStore(t testing.TB, client redis.UniversalClient) *Store {
	t.Helper()
	s := newUncleanedStore(t, client)
	t.Cleanup(func() { deletePrefix(t, s) })
	return s
}

// newUncleanedStore returns a store under a fresh prefix and leaves its keys
// behind (for clients that cannot reach a server).
func newUncleanedStore(t testing.TB, client redis.UniversalClient) *Store {
	t.Helper()
	s, err := New(client, Config{Prefix: testPrefix()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// deletePrefix removes every key of s (records and tombstones), on every
// master.
func deletePrefix(t testing.TB, s *Store) {
	ctx := context.Background()
	nodes, err := s.masters(ctx)
	if err != nil {
		t.Logf("cleanup of %s: %v", s.cfg.Prefix, err)
		return
	}
	for _, n := range nodes {
		var cursor uint64
		for {
			keys, next, err := n.client.Scan(ctx, cursor, globEscape(s.cfg.Prefix)+":*", 1000).Result()
			if err != nil {
				t.Logf("cleanup of %s: %v", s.cfg.Prefix, err)
				return
			}
			// One key per command: a Cluster node refuses multi-key
			// commands across slots.
			pipe := n.client.Pipeline()
			for _, k := range keys {
				pipe.Unlink(ctx, k)
			}
			if _, err := pipe.Exec(ctx); err != nil && len(keys) > 0 {
				t.Logf("cleanup of %s: %v", s.cfg.Prefix, err)
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

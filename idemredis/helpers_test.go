package idemredis

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"net"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/internal/testenv"
)

// requireEnv returns the server address the test needs; see testenv.Getenv.
func requireEnv(t testing.TB, name string) string {
	t.Helper()
	return testenv.Getenv(t, name)
}

// standaloneClient connects to IDEM_TEST_REDIS_URL, a redis:// URL that
// rueidis.ParseURL reads as go-redis's ParseURL would.
func standaloneClient(t testing.TB) rueidis.Client {
	t.Helper()
	return newClient(t, standaloneOption(t))
}

// standaloneOption is the client option of standaloneClient.
func standaloneOption(t testing.TB) rueidis.ClientOption {
	t.Helper()
	opt, err := rueidis.ParseURL(requireEnv(t, "IDEM_TEST_REDIS_URL"))
	if err != nil {
		t.Fatalf("IDEM_TEST_REDIS_URL: %v", err)
	}
	return opt
}

// clusterClient connects to the Cluster seeds in IDEM_TEST_REDIS_CLUSTER.
func clusterClient(t testing.TB) rueidis.Client {
	t.Helper()
	return newClient(t, clusterOption(t))
}

// clusterOption is the client option of clusterClient.
func clusterOption(t testing.TB) rueidis.ClientOption {
	t.Helper()
	return rueidis.ClientOption{InitAddress: strings.Split(requireEnv(t, "IDEM_TEST_REDIS_CLUSTER"), ",")}
}

// newClient makes a client with opt, closed when the test ends.
func newClient(t testing.TB, opt rueidis.ClientOption) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("connecting to %v: %v", opt.InitAddress, err)
	}
	t.Cleanup(c.Close)
	return c
}

// nodeClient connects to the one node at addr, Cluster member or not.
func nodeClient(t testing.TB, addr string) rueidis.Client {
	t.Helper()
	return newClient(t, rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true})
}

// testPrefix returns a key prefix no other test uses.
func testPrefix() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "idemtest-" + hex.EncodeToString(b)
}

// newTestStore returns a store under a fresh prefix whose keys are deleted
// when the test ends.
func newTestStore(t testing.TB, client rueidis.Client) *Store {
	t.Helper()
	s := newUncleanedStore(t, client)
	t.Cleanup(func() { deletePrefix(t, s) })
	return s
}

// newUncleanedStore returns a store under a fresh prefix and leaves its keys
// behind (for clients that cannot reach a server).
func newUncleanedStore(t testing.TB, client rueidis.Client) *Store {
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
			e, err := n.client.Do(ctx, n.client.B().Scan().Cursor(cursor).Match(globEscape(s.cfg.Prefix)+":*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				t.Logf("cleanup of %s: %v", s.cfg.Prefix, err)
				return
			}
			// One key per command: a Cluster node refuses multi-key
			// commands across slots.
			cmds := make(rueidis.Commands, len(e.Elements))
			for i, k := range e.Elements {
				cmds[i] = n.client.B().Unlink().Key(k).Build()
			}
			if err := firstError(n.client.DoMulti(ctx, cmds...)); err != nil {
				t.Logf("cleanup of %s: %v", s.cfg.Prefix, err)
			}
			if cursor = e.Cursor; cursor == 0 {
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

// setLeaseUntil sets the lease deadline (Unix microseconds) of the record
// at key in place, as time passing would make it expire or not.
func setLeaseUntil(t testing.TB, c rueidis.Client, key string, lu int64) {
	t.Helper()
	b := binary.BigEndian.AppendUint64(nil, uint64(lu))
	if err := c.Do(context.Background(), c.B().Setrange().Key(key).Offset(offLeaseUntil).Value(string(b)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

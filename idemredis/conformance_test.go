package idemredis

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemstore/idemstoretest"
)

func TestConformanceStandalone(t *testing.T) {
	t.Parallel()
	client := standaloneClient(t)
	url := requireEnv(t, "IDEM_TEST_REDIS_URL")
	idemstoretest.Exercise(t, idemstoretest.Harness{
		New: func(t *testing.T) idemstore.Store { return newTestStore(t, client) },
		Unavailable: func(t *testing.T) idemstore.Store {
			return cutOffStore(t, rueidis.MustParseURL(url))
		},
	})
}

func TestConformanceCluster(t *testing.T) {
	t.Parallel()
	client := clusterClient(t)
	seeds := strings.Split(requireEnv(t, "IDEM_TEST_REDIS_CLUSTER"), ",")
	idemstoretest.Exercise(t, idemstoretest.Harness{
		New: func(t *testing.T) idemstore.Store { return newTestStore(t, client) },
		Unavailable: func(t *testing.T) idemstore.Store {
			return cutOffStore(t, rueidis.ClientOption{InitAddress: seeds})
		},
	})
}

// TestConcurrencyCluster races reservations of keys spread over many slots
// (and so over every master) of the Cluster.
func TestConcurrencyCluster(t *testing.T) {
	t.Parallel()
	client := clusterClient(t)
	idemstoretest.ExerciseConcurrency(t, idemstoretest.Harness{
		New: func(t *testing.T) idemstore.Store { return newTestStore(t, client) },
	})
}

// cutOffStore returns a store whose client, made with opt, has lost its
// servers since New checked them: see cutOff.
func cutOffStore(t *testing.T, opt rueidis.ClientOption) *Store {
	t.Helper()
	c, cut := cutOff(t, opt)
	s := newUncleanedStore(t, c)
	cut()
	return s
}

// cutOff returns a client made with opt, and cut, which makes it lose its
// servers: every connection it holds is closed and every later dial goes
// to a loopback port nothing listens on, as after a crash of every node.
// The client does not retry.
func cutOff(t *testing.T, opt rueidis.ClientOption) (rueidis.Client, func()) {
	t.Helper()
	var (
		mu    sync.Mutex
		down  bool
		conns []net.Conn
	)
	refused := closedAddr(t)
	opt.DisableRetry = true
	opt.DialCtxFn = func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		if down {
			addr = refused
		}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			conns = append(conns, c)
		}
		return c, err
	}
	c := newClient(t, opt)
	return c, func() {
		mu.Lock()
		defer mu.Unlock()
		down = true
		for _, conn := range conns {
			_ = conn.Close()
		}
	}
}

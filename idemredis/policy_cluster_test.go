package idemredis

import (
	"errors"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// redisCliBin builds the throwaway Clusters.
const redisCliBin = "/usr/bin/redis-cli"

// redisCli runs redis-cli with args and returns its output.
func redisCli(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(redisCliBin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// clusterNode starts a throwaway Cluster node under policy.
func clusterNode(t *testing.T, policy string) string {
	t.Helper()
	return throwaway(t, "cluster-enabled yes", "cluster-node-timeout 5000", "maxmemory-policy "+policy)
}

// nodeID returns the Cluster node id of the node at addr.
func nodeID(t *testing.T, addr string) string {
	t.Helper()
	c := nodeClient(t, addr)
	id, err := c.Do(t.Context(), c.B().ClusterMyid().Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// waitFor polls cond until it holds, for up to 20s: the Cluster's nodes
// learn of each other by gossip, and nothing tells when they have.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 400 {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("waited 20s for %s", what)
}

// waitAgreed waits until redis-cli's own check of the Cluster at addr
// finds every node agreeing on the slots and no open slot: redis-cli
// refuses to add a node or move a slot before.
func waitAgreed(t *testing.T, addr string) {
	t.Helper()
	waitFor(t, "the Cluster's nodes to agree", func() bool {
		out, err := exec.Command(redisCliBin, "--cluster", "check", addr).CombinedOutput()
		return err == nil && strings.Contains(string(out), "[OK] All nodes agree") && !strings.Contains(string(out), "[ERR]")
	})
}

// slotsName reports whether CLUSTER SLOTS, asked of the node at at, names
// the node at addr (as a master or a replica of a slot range).
func slotsName(t *testing.T, at, addr string) bool {
	c := nodeClient(t, at)
	entries, err := c.Do(t.Context(), c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return false
	}
	for _, e := range entries {
		f, _ := e.ToArray()
		for _, n := range f[min(2, len(f)):] {
			m, _ := n.ToArray()
			if len(m) < 2 {
				continue
			}
			host, _ := m[0].ToString()
			if host == "" {
				host, _, _ = net.SplitHostPort(at)
			}
			if port, err := m[1].AsInt64(); err == nil && net.JoinHostPort(host, strconv.FormatInt(port, 10)) == addr {
				return true
			}
		}
	}
	return false
}

// TestPolicyCluster checks every node of a throwaway Cluster: a master
// with an evicting policy, a replica with one (it would evict once
// promoted), a master whose policy changes at run time, and a master added
// and given a slot after New. Each is refused, by address.
func TestPolicyCluster(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	if _, err := exec.LookPath(redisCliBin); err != nil {
		t.Skipf("%s is missing: %v", redisCliBin, err)
	}
	masters := []string{clusterNode(t, "noeviction"), clusterNode(t, "noeviction"), clusterNode(t, "volatile-lru")}
	redisCli(t, append(append([]string{"--cluster", "create"}, masters...), "--cluster-yes")...)
	replica := clusterNode(t, "allkeys-lru")
	waitAgreed(t, masters[0])
	redisCli(t, "--cluster", "add-node", replica, masters[0], "--cluster-slave", "--cluster-master-id", nodeID(t, masters[0]))
	for _, m := range masters {
		waitFor(t, m+" to name the replica "+replica, func() bool { return slotsName(t, m, replica) })
		waitFor(t, m+" to serve", func() bool {
			c := nodeClient(t, m)
			info, err := c.Do(t.Context(), c.B().ClusterInfo().Build()).ToString()
			return err == nil && strings.Contains(info, "cluster_state:ok")
		})
	}
	clientOpt := rueidis.ClientOption{InitAddress: masters, DisableCache: true}
	c := newClient(t, clientOpt)
	ctx := t.Context()

	_, err := New(c, Config{})
	if !errors.Is(err, ErrEvictionPolicy) || !strings.Contains(err.Error(), "master "+masters[2]+" has maxmemory-policy volatile-lru") ||
		!strings.Contains(err.Error(), "other node "+replica+" has maxmemory-policy allkeys-lru") {
		t.Fatalf("New on a Cluster with an evicting master and replica: %v", err)
	}
	configSet(t, nodeClient(t, masters[2]), "maxmemory-policy", "noeviction")
	if _, err := New(c, Config{}); !errors.Is(err, ErrEvictionPolicy) || strings.Contains(err.Error(), masters[2]) {
		t.Fatalf("New with the replica still allkeys-lru: %v", err)
	}
	configSet(t, nodeClient(t, replica), "maxmemory-policy", "noeviction")
	s, err := New(c, Config{Prefix: testPrefix(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}

	// At run time: a master's policy changes, and back.
	configSet(t, nodeClient(t, masters[1]), "maxmemory-policy", "allkeys-lfu")
	if err := s.CheckPolicy(ctx); !errors.Is(err, ErrEvictionPolicy) || !strings.Contains(err.Error(), masters[1]) {
		t.Fatalf("CheckPolicy after a master changed to allkeys-lfu: %v", err)
	}
	if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: charge("k").Key, Fingerprint: "fp", Token: "t", Lease: time.Minute}); !errors.Is(err, idemstore.ErrUnavailable) {
		t.Fatalf("Reserve while a master can evict: %v", err)
	}
	configSet(t, nodeClient(t, masters[1]), "maxmemory-policy", "noeviction")
	if _, err := s.ListExpiredLeases(ctx, 10); err != nil {
		t.Fatal(err)
	}
	reserve(t, s, "k", "t", time.Minute)

	// A master added after New: without slots it holds no records and is
	// not asked; once it serves a slot, the next check finds it.
	added := clusterNode(t, "volatile-ttl")
	waitAgreed(t, masters[0])
	redisCli(t, "--cluster", "add-node", added, masters[0])
	addedID := nodeID(t, added)
	for _, n := range append([]string{replica}, masters...) {
		waitFor(t, n+" to know "+added, func() bool {
			c := nodeClient(t, n)
			nodes, err := c.Do(ctx, c.B().ClusterNodes().Build()).ToString()
			return err == nil && strings.Contains(nodes, addedID)
		})
	}
	if err := s.CheckPolicy(ctx); err != nil {
		t.Fatalf("CheckPolicy with a master that serves no slot: %v", err)
	}
	waitAgreed(t, masters[0])
	redisCli(t, "--cluster", "reshard", masters[0], "--cluster-from", nodeID(t, masters[0]), "--cluster-to", addedID,
		"--cluster-slots", "1", "--cluster-yes")
	waitFor(t, "every master to give "+added+" its slot", func() bool {
		return !slices.ContainsFunc(masters, func(m string) bool { return !slotsName(t, m, added) })
	})
	if err := s.CheckPolicy(ctx); !errors.Is(err, ErrEvictionPolicy) || !strings.Contains(err.Error(), "master "+added+" has maxmemory-policy volatile-ttl") {
		t.Fatalf("CheckPolicy after a volatile-ttl master got a slot: %v", err)
	}
}

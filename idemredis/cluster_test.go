package idemredis

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// clusterRecords creates n records in every state under s, spread over the
// slots, and returns them as stored.
func clusterRecords(t *testing.T, s *Store, n int) []*idemstore.Record {
	t.Helper()
	ctx := t.Context()
	var out []*idemstore.Record
	for i := range n {
		k := idemstore.Key{Scope: fmt.Sprintf("tenant-%d", i%7), Operation: "POST /payments", Key: fmt.Sprintf("key-%d", i)}
		tok := fmt.Sprintf("tok-%d", i)
		_, created, err := s.Reserve(ctx, idemstore.ReserveParams{
			Key: k, Fingerprint: "fp", Token: tok, Lease: time.Hour,
		})
		if err != nil || !created {
			t.Fatalf("Reserve(%v) = created %v, %v", k, created, err)
		}
		switch i % 3 {
		case 1:
			err = s.Complete(ctx, idemstore.CompleteParams{
				Key: k, Token: tok, Retention: 24 * time.Hour,
				Response: &idemstore.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: fmt.Appendf(nil, `{"n":%d}`, i)},
			})
		case 2:
			err = s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: tok, Reason: "provider timed out"})
		}
		if err != nil {
			t.Fatalf("changing %v: %v", k, err)
		}
		got, err := s.Get(ctx, k)
		if err != nil {
			t.Fatalf("Get(%v): %v", k, err)
		}
		out = append(out, got)
	}
	return out
}

// TestClusterRecordsOnEveryMaster checks that records spread over every
// master and that each record's keys (hash and channel) sit in one slot.
func TestClusterRecordsOnEveryMaster(t *testing.T) {
	t.Parallel()
	cc := clusterClient(t)
	s := newTestStore(t, cc)
	ctx := t.Context()
	masters, err := s.masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(masters) < 3 {
		t.Fatalf("cluster has %d masters, want at least 3", len(masters))
	}
	recs := clusterRecords(t, s, 60)
	onMaster := map[string]int{}
	for _, rec := range recs {
		rk, ch := s.recordKey(rec.Key), s.channel(rec.Key)
		if slot, chSlot := keySlot(t, cc, rk), keySlot(t, cc, ch); slot != chSlot {
			t.Errorf("%v: record in slot %d, channel in slot %d", rec.Key, slot, chSlot)
		}
		m := masterFor(t, s, rk)
		// The record lives on the master that owns its slot, whole.
		n, err := m.client.Do(ctx, m.client.B().Strlen().Key(rk).Build()).AsInt64()
		if err != nil || n < fixedHead {
			t.Errorf("%v: STRLEN on %s = %d, %v", rec.Key, m.addr, n, err)
		}
		onMaster[m.addr]++
	}
	if len(onMaster) != len(masters) {
		t.Fatalf("records landed on %d of %d masters: %v", len(onMaster), len(masters), onMaster)
	}
	page, err := s.List(ctx, idemstore.ListParams{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Records) != len(recs) || page.NextCursor != "" {
		t.Fatalf("List over the cluster: %d records (cursor %q), want %d", len(page.Records), page.NextCursor, len(recs))
	}
}

// TestClusterFailover promotes the replica of a master that holds records
// (CLUSTER FAILOVER, which waits for the replica to catch up) and checks
// that every record survives whole, keeps its TTL and can still change
// state. It fails back afterwards. It does not call t.Parallel, so it runs
// before the parallel tests of this package start.
func TestClusterFailover(t *testing.T) {
	cc := clusterClient(t)
	s := newTestStore(t, cc)
	ctx := t.Context()
	recs := clusterRecords(t, s, 30)

	master := masterFor(t, s, s.recordKey(recs[0].Key))
	id, err := master.client.Do(ctx, master.client.B().ClusterMyid().Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	replicas, err := master.client.Do(ctx, master.client.B().ClusterReplicas().NodeId(id).Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(replicas) == 0 {
		msg := "master " + master.addr + " has no replica; scripts/redis.sh adds one per master"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	replicaAddr, _, _ := strings.Cut(strings.Fields(replicas[0])[1], "@")
	oldAddr := master.addr
	replica := nodeClient(t, replicaAddr)
	old := nodeClient(t, oldAddr)
	// A waiter on a record of the master that steps down: its node ends
	// the sharded subscription, which closes the waiter's channel.
	notify, cancel, err := s.Subscribe(ctx, recs[0].Key)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()

	failover(t, s, replica, replicaAddr, s.recordKey(recs[0].Key))
	if receive(t, notify) {
		t.Fatal("a notification came after the failover, want the subscription ended")
	}
	// Fail back, so the cluster keeps the layout scripts/redis.sh made.
	t.Cleanup(func() { failover(t, s, old, oldAddr, s.recordKey(recs[0].Key)) })

	moved := 0
	for _, want := range recs {
		got, err := s.Get(ctx, want.Key)
		if err != nil {
			t.Fatalf("after failover, Get(%v): %v", want.Key, err)
		}
		got.ReadAt = want.ReadAt // read again, later
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("after failover, %v changed:\n got %+v\nwant %+v", want.Key, got, want)
		}
		if m := masterFor(t, s, s.recordKey(want.Key)); m.addr == replicaAddr {
			moved++
			ms, err := m.client.Do(ctx, m.client.B().Pttl().Key(s.recordKey(want.Key)).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			if (want.State == idemstore.StateCompleted) != (ms > 0) {
				t.Errorf("after failover, %v (%s) has PTTL %dms", want.Key, want.State, ms)
			}
		}
	}
	if moved == 0 {
		t.Fatalf("no record is served by the promoted replica %s", replicaAddr)
	}
	// The new master may not have the scripts cached (NOSCRIPT → EVAL).
	for _, rec := range recs {
		if rec.State != idemstore.StatePending {
			continue
		}
		err := s.Complete(ctx, idemstore.CompleteParams{Key: rec.Key, Token: rec.Token, Response: &idemstore.Response{Status: 204},
			Retention: time.Hour})
		if err != nil {
			t.Fatalf("Complete(%v) after failover: %v", rec.Key, err)
		}
		if got, err := s.Get(ctx, rec.Key); err != nil || got.State != idemstore.StateCompleted {
			t.Fatalf("after Complete, Get(%v) = %+v, %v", rec.Key, got, err)
		}
	}
}

// failover asks the replica node at addr to take over its master (CLUSTER
// FAILOVER) and waits until the cluster serves key from it. A replica that
// was a master a moment ago may not be known as a replica by its new
// master yet, which then ignores the request (it times out after 5s), so
// the request is repeated. The waits are bounded so a broken cluster fails
// the test instead of hanging it.
func failover(t *testing.T, s *Store, node rueidis.Client, addr, key string) {
	t.Helper()
	ctx := context.Background()
	role := func() []string {
		r, _ := node.Do(ctx, node.B().Role().Build()).ToArray()
		out := make([]string, len(r))
		for i := range r {
			out[i], _ = r[i].ToString()
		}
		return out
	}
	for attempt := 0; attempt < 5; attempt++ {
		// Wait until the replica's link to its master is up and every
		// master counts it as a replica.
		for range 100 {
			if r := role(); len(r) >= 4 && (r[0] == "master" || r[3] == "connected" && knownReplica(ctx, s, node)) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if r := role(); len(r) == 0 || r[0] != "master" {
			if err := node.Do(ctx, node.B().ClusterFailover().Build()).Error(); err != nil {
				t.Fatalf("CLUSTER FAILOVER on %s: %v", addr, err)
			}
		}
		for range 150 {
			if r := role(); len(r) > 0 && r[0] == "master" {
				if m, err := masterOf(ctx, s, key); err == nil && m.addr == addr {
					return
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("%s is not master yet; repeating CLUSTER FAILOVER", addr)
	}
	t.Fatalf("%s did not become master after 5 CLUSTER FAILOVER requests", addr)
}

// knownReplica reports whether every master sees node as a replica. The
// masters vote in the failover election and refuse a node they still take
// for a master, and a refused election can only be retried after twice
// the cluster node timeout.
func knownReplica(ctx context.Context, s *Store, node rueidis.Client) bool {
	id, err := node.Do(ctx, node.B().ClusterMyid().Build()).ToString()
	if err != nil {
		return false
	}
	masters, err := s.masters(ctx)
	if err != nil {
		return false
	}
	for _, m := range masters {
		nodes, err := m.client.Do(ctx, m.client.B().ClusterNodes().Build()).ToString()
		if err != nil {
			return false
		}
		seen := false
		for _, line := range strings.Split(nodes, "\n") {
			if f := strings.Fields(line); len(f) > 2 && f[0] == id {
				seen = strings.Contains(f[2], "slave")
				break
			}
		}
		if !seen {
			return false
		}
	}
	return true
}

// keySlot returns the Cluster hash slot of key, by CLUSTER KEYSLOT.
func keySlot(t *testing.T, c rueidis.Client, key string) int64 {
	t.Helper()
	slot, err := c.Do(t.Context(), c.B().ClusterKeyslot().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return slot
}

// masterOf returns the master that serves key by CLUSTER SLOTS.
func masterOf(ctx context.Context, s *Store, key string) (node, error) {
	slot, err := s.client.Do(ctx, s.client.B().ClusterKeyslot().Key(key).Build()).AsInt64()
	if err != nil {
		return node{}, err
	}
	masters, err := s.masters(ctx)
	if err != nil {
		return node{}, err
	}
	for _, m := range masters {
		for _, r := range m.slots {
			if r[0] <= slot && slot <= r[1] {
				return m, nil
			}
		}
	}
	return node{}, fmt.Errorf("no master serves slot %d", slot)
}

// masterFor is masterOf for tests.
func masterFor(t *testing.T, s *Store, key string) node {
	t.Helper()
	m, err := masterOf(t.Context(), s, key)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestKeyInSlot checks the store's slot hash against the Cluster's own
// CLUSTER KEYSLOT, and that keyInSlot finds a key for slots at both ends
// and in between.
func TestKeyInSlot(t *testing.T) {
	t.Parallel()
	cc := clusterClient(t)
	if got := crc16("123456789"); got != 0x31c3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3 (CRC-16/XMODEM)", got)
	}
	for _, slot := range []int64{0, 1, 866, 8191, 12182, 16383} {
		k := keyInSlot(slot)
		if k == "" {
			t.Fatalf("keyInSlot(%d) found no key", slot)
		}
		if got := keySlot(t, cc, k); got != slot {
			t.Errorf("keyInSlot(%d) = %q, which the Cluster puts in slot %d", slot, k, got)
		}
	}
}

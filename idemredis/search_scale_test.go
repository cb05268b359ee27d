package idemredis

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/searchbench"
)

// TestSearchAtScale times the admin searches on a million records, ten
// thousand in review, under a prefix of their own (deleted after), on a
// single node, and with IDEM_BENCH_SEARCH_CLUSTER=1 on the Cluster too
// (see package searchbench and scripts/bench-admin.sh).
func TestSearchAtScale(t *testing.T) {
	runs := searchbench.Enabled(t)
	topos := topologies[:1]
	if os.Getenv("IDEM_BENCH_SEARCH_CLUSTER") != "" {
		topos = topologies
	}
	for _, topo := range topos {
		t.Run(topo.name, func(t *testing.T) {
			s := newTestStore(t, topo.client(t))
			start := time.Now()
			loadSearchRecords(t, s)
			fmt.Printf("redis %s: loaded %d records in %v\n", topo.name, searchbench.Records, time.Since(start).Round(time.Second))
			searchbench.Measure(t, "redis-"+topo.name, s, runs)
		})
	}
}

// loadSearchRecords writes searchbench's records and their index entries
// as the scripts would, pipelined: a SET per record and ZADDs of many
// members per index set.
func loadSearchRecords(t *testing.T, s *Store) {
	t.Helper()
	ctx := t.Context()
	resp := idemstore.EncodeResponse(&idemstore.Response{Status: 201, Body: []byte(strings.Repeat("x", 120))})
	req := idemstore.EncodeRequest(&idemstore.Request{Method: "POST", Path: "/payments"})
	now := time.Now().UnixMicro()
	type zadd struct {
		scores  []float64
		members []string
	}
	pending := map[string]*zadd{}
	var cmds rueidis.Commands
	flush := func(all bool) {
		for key, z := range pending {
			if !all && len(z.members) < 200 {
				continue
			}
			c := s.client.B().Zadd().Key(key).ScoreMember()
			for i := range z.members {
				c = c.ScoreMember(z.scores[i], z.members[i])
			}
			cmds = append(cmds, c.Build().Pin())
			delete(pending, key)
		}
		// Every command is idempotent: send the batch again when a
		// connection breaks (other tests fail the Cluster's masters over).
		var err error
		for range 5 {
			if err = firstError(s.client.DoMulti(ctx, cmds...)); err == nil {
				break
			}
			time.Sleep(time.Second)
		}
		if err != nil {
			t.Fatal(err)
		}
		cmds = cmds[:0]
	}
	add := func(set string, score int64, member string) {
		z := pending[set]
		if z == nil {
			z = &zadd{}
			pending[set] = z
		}
		z.scores = append(z.scores, float64(score))
		z.members = append(z.members, member)
	}
	for i := 1; i <= searchbench.Records; i++ {
		k := idemstore.Key{Scope: searchbench.Scope(i), Operation: "POST /payments", Key: "order-" + strconv.Itoa(i%searchbench.KeyModulo)}
		label := "acct_" + strconv.Itoa(i%searchbench.Labels)
		created := now - int64(searchbench.Records-i)*86_000
		st, expires, reason, answer := byte('c'), now+86_400_000_000, "", resp
		if i%searchbench.ReviewEvery == 0 {
			st, expires, reason, answer = 'r', 0, "upstream timeout after the request was sent", nil
		}
		b := []byte{labelLayout, st, 0}
		for _, v := range []int64{created, created, expires, created} {
			b = binary.BigEndian.AppendUint64(b, uint64(v))
		}
		tail := pendingTail(k, "tok-"+strconv.Itoa(i), "v2:fp", req, label)
		b = append(b, tail[:len(tail)-4]...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(reason)))
		b = append(b, reason...)
		b = append(b, answer...)
		names := s.keys(k)
		set := s.client.B().Set().Key(names.record).Value(rueidis.BinaryString(b))
		if st == 'c' {
			cmds = append(cmds, set.PxMilliseconds(2*86_400_000).Build().Pin())
		} else {
			cmds = append(cmds, set.Build().Pin())
			add(names.ix.review, created, ageMember(k))
		}
		add(names.ix.key, 0, keyMember(k))
		add(names.ix.all, created, ageMember(k))
		add(names.ix.label, 0, labelMember(label, k))
		if len(cmds) >= 5000 {
			flush(false)
		}
	}
	flush(true)
}

package idemredis

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
)

// Listing works by SCAN with MATCH "<prefix>:{*}:r" and TYPE hash on every
// master (on a Cluster, the masters from ForEachMaster, in address order),
// followed by one pipeline per SCAN batch of TIME and an HMGET of state,
// lease and operation per key, and one pipeline of TIME and the whole
// records for those returned. TIME comes from the node that holds the
// records, first in the pipeline: it is the node's clock at or just before
// the reads, which judge expiry and become the records' ReadAt. There is no index, so the
// scripts that change records stay single-key and single-round-trip; the
// price is that List, ListExpiredLeases and Purge read through every key of
// every master (see doc.go).

// node is one master that holds part of the keyspace.
type node struct {
	addr   string
	client redis.Cmdable
}

// masters returns the nodes to scan, in a stable order.
func (s *Store) masters(ctx context.Context) ([]node, error) {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return []node{{client: s.client}}, nil
	}
	var (
		mu    sync.Mutex
		nodes []node
	)
	err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		nodes = append(nodes, node{addr: c.Options().Addr, client: c})
		return nil
	})
	if err != nil {
		return nil, interpretError(ctx, err)
	}
	slices.SortFunc(nodes, func(a, b node) int { return cmp.Compare(a.addr, b.addr) })
	return nodes, nil
}

// position says where a record was found: the node, the SCAN cursor that
// started its batch, and its key. Batches are visited in key order, so
// re-running the batch and skipping keys up to and including key resumes
// right after the record.
type position struct {
	node   int
	cursor uint64
	key    string
}

func (p position) encode() string {
	s := strconv.Itoa(p.node) + ":" + strconv.FormatUint(p.cursor, 10) + ":" + p.key
	return base64.RawURLEncoding.EncodeToString([]byte(s))
}

var errBadCursor = errors.New("idemredis: invalid list cursor")

func decodePosition(cursor string) (position, error) {
	if cursor == "" {
		return position{}, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		return position{}, errBadCursor
	}
	parts := strings.SplitN(string(b), ":", 3)
	if len(parts) != 3 {
		return position{}, errBadCursor
	}
	n, err1 := strconv.Atoi(parts[0])
	c, err2 := strconv.ParseUint(parts[1], 10, 64)
	if err1 != nil || err2 != nil || n < 0 {
		return position{}, errBadCursor
	}
	return position{node: n, cursor: c, key: parts[2]}, nil
}

// summary is what the first, cheap pass of a listing reads of a record,
// with the TIME of the node that holds it.
type summary struct {
	state      idemstore.State
	operation  string
	leaseUntil time.Time
	now        time.Time
}

// hit is a record the first pass selected.
type hit struct {
	pos        position
	node       redis.Cmdable
	leaseUntil time.Time
}

// walk visits the store's records from pos on, node by node and SCAN batch
// by batch, each batch in key order. For each batch it reads only the state,
// lease deadline and operation of each record and the node's TIME (one
// pipeline), and calls fn for those keep accepts, until fn returns false or
// the last node is done. A record may be visited twice if SCAN returns it
// twice (it can while the keyspace is rehashed); records created during the
// walk may or may not be visited.
func (s *Store) walk(ctx context.Context, from position, keep func(summary) bool, fn func(hit) bool) error {
	nodes, err := s.masters(ctx)
	if err != nil {
		return err
	}
	for i := from.node; i < len(nodes); i++ {
		cursor, after := uint64(0), ""
		if i == from.node {
			cursor, after = from.cursor, from.key
		}
		for {
			keys, next, err := nodes[i].client.ScanType(ctx, cursor, s.match, int64(s.cfg.ScanCount), "hash").Result()
			if err != nil {
				return interpretError(ctx, err)
			}
			slices.Sort(keys)
			keys = slices.Compact(keys)
			if after != "" {
				j, _ := slices.BinarySearch(keys, after)
				for j < len(keys) && keys[j] <= after {
					j++
				}
				keys = keys[j:]
			}
			sums, err := s.summaries(ctx, nodes[i].client, keys)
			if err != nil {
				return err
			}
			for j, sum := range sums {
				if sum == nil || !keep(*sum) {
					continue
				}
				h := hit{pos: position{node: i, cursor: cursor, key: keys[j]}, node: nodes[i].client, leaseUntil: sum.leaseUntil}
				if !fn(h) {
					return nil
				}
			}
			cursor, after = next, ""
			if cursor == 0 {
				break
			}
		}
	}
	return nil
}

// summaries reads the state, lease deadline and operation of the records
// under keys, after the node's TIME, in one pipeline; a key that vanished
// since the SCAN yields nil.
func (s *Store) summaries(ctx context.Context, c redis.Cmdable, keys []string) ([]*summary, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	pipe := c.Pipeline()
	clock := pipe.Time(ctx)
	cmds := make([]*redis.SliceCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.HMGet(ctx, k, fieldNames[fState], fieldNames[fLeaseUntil], fieldNames[fOperation])
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, interpretError(ctx, err)
	}
	now := clock.Val().UTC()
	out := make([]*summary, len(keys))
	for i, cmd := range cmds {
		v := cmd.Val()
		st, ok := v[0].(string)
		if !ok {
			continue
		}
		lu, _ := v[1].(string)
		lease, err := parseMicros(lu)
		if err != nil {
			return nil, fmt.Errorf("idemredis: bad lease_until in %s: %w", keys[i], err)
		}
		op, _ := v[2].(string)
		out[i] = &summary{state: idemstore.State(st), operation: op, leaseUntil: lease, now: now}
	}
	return out, nil
}

// fetch reads the whole records of hits, one pipeline (the node's TIME,
// then the records) per node, and keeps, in the order of hits, those that
// still exist and that keep still accepts (a record can change between the
// two passes). Each record's ReadAt is its node's TIME.
func (s *Store) fetch(ctx context.Context, hits []hit, keep func(summary) bool) ([]*idemstore.Record, error) {
	recs := make([]*idemstore.Record, len(hits))
	done := make([]bool, len(hits))
	for first := range hits {
		if done[first] {
			continue
		}
		node := hits[first].pos.node
		pipe := hits[first].node.Pipeline()
		clock := pipe.Time(ctx)
		var idx []int
		var cmds []*redis.SliceCmd
		for i := first; i < len(hits); i++ {
			if !done[i] && hits[i].pos.node == node {
				done[i] = true
				idx = append(idx, i)
				cmds = append(cmds, pipe.HMGet(ctx, hits[i].pos.key, fieldNames[:]...))
			}
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, interpretError(ctx, err)
		}
		now := clock.Val().UTC()
		for j, cmd := range cmds {
			rec, err := decodeRecord(cmd.Val(), now)
			if err != nil {
				return nil, fmt.Errorf("%w (key %s)", err, hits[idx[j]].pos.key)
			}
			if rec != nil && keep(summary{state: rec.State, operation: rec.Key.Operation, leaseUntil: rec.LeaseUntil, now: now}) {
				recs[idx[j]] = rec
			}
		}
	}
	return slices.DeleteFunc(recs, func(r *idemstore.Record) bool { return r == nil }), nil
}

// List pages through the store's records, optionally filtered by state and
// operation. Records come in SCAN order (by node, then by batch, then by
// key), which is stable while the keyspace does not change; the cursor is
// opaque. A page reads the state and operation of every record it passes
// over but the whole record only of those it returns.
func (s *Store) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	p = p.Normalize()
	if p.State != "" && !p.State.Valid() {
		return idemstore.ListPage{}, fmt.Errorf("idemredis: unknown state %q", p.State)
	}
	from, err := decodePosition(p.Cursor)
	if err != nil {
		return idemstore.ListPage{}, err
	}
	keep := func(sum summary) bool {
		return (p.State == "" || sum.state == p.State) && (p.Operation == "" || sum.operation == p.Operation)
	}
	for {
		var hits []hit
		err = s.walk(ctx, from, keep, func(h hit) bool {
			hits = append(hits, h)
			return len(hits) <= p.Limit // one more than a page says whether more follow
		})
		if err != nil {
			return idemstore.ListPage{}, err
		}
		var page idemstore.ListPage
		if len(hits) > p.Limit {
			hits = hits[:p.Limit]
			page.NextCursor = hits[len(hits)-1].pos.encode()
			from = hits[len(hits)-1].pos
		}
		if page.Records, err = s.fetch(ctx, hits, keep); err != nil {
			return idemstore.ListPage{}, err
		}
		// Every record of the page changed between the passes: go on
		// rather than return an empty page that is not the last.
		if len(page.Records) > 0 || page.NextCursor == "" {
			return page, nil
		}
	}
}

// ListExpiredLeases returns up to limit pending records whose lease expired
// by the TIME of the node that holds them, oldest deadline first. limit
// follows idemstore.PageLimit. With no index to sort by, it makes one full
// pass, keeping the limit oldest deadlines seen, then reads those records
// whole and drops any that changed meanwhile (an extended lease, a released
// record), so it may return fewer than limit while more are expired.
func (s *Store) ListExpiredLeases(ctx context.Context, limit int) ([]*idemstore.Record, error) {
	limit = idemstore.PageLimit(limit)
	keep := func(sum summary) bool {
		return sum.state == idemstore.StatePending && !sum.leaseUntil.After(sum.now)
	}
	var hits []hit
	err := s.walk(ctx, position{}, keep, func(h hit) bool {
		if hits = append(hits, h); len(hits) >= 2*limit {
			hits = oldestDeadlines(hits, limit)
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	hits = oldestDeadlines(hits, limit)
	recs, err := s.fetch(ctx, hits, keep)
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(recs, func(a, b *idemstore.Record) int { return a.LeaseUntil.Compare(b.LeaseUntil) })
	return recs, nil
}

// oldestDeadlines sorts hits by lease deadline (then node and key), drops
// the second visit of a record that SCAN returned twice, and keeps the
// first limit.
func oldestDeadlines(hits []hit, limit int) []hit {
	slices.SortFunc(hits, func(a, b hit) int {
		return cmp.Or(a.leaseUntil.Compare(b.leaseUntil), cmp.Compare(a.pos.node, b.pos.node), cmp.Compare(a.pos.key, b.pos.key))
	})
	type id struct {
		node int
		key  string
	}
	seen := make(map[id]bool, len(hits))
	hits = slices.DeleteFunc(hits, func(h hit) bool {
		k := id{h.pos.node, h.pos.key}
		dup := seen[k]
		seen[k] = true
		return dup
	})
	return hits[:min(len(hits), limit)]
}

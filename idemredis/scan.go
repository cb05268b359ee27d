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
// followed by one pipelined HMGET per SCAN batch. There is no index, so the
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

// walk visits the store's records from pos on, node by node and SCAN batch
// by batch, each batch in key order, until fn returns false or the last node
// is done. A record may be visited twice if SCAN returns it twice (it can
// while the keyspace is rehashed); records created during the walk may or
// may not be visited.
func (s *Store) walk(ctx context.Context, from position, fn func(position, *idemstore.Record) bool) error {
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
			recs, err := s.read(ctx, nodes[i].client, keys)
			if err != nil {
				return err
			}
			for j, rec := range recs {
				if rec != nil && !fn(position{node: i, cursor: cursor, key: keys[j]}, rec) {
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

// read fetches the records under keys in one pipeline; a key that vanished
// since the SCAN yields nil.
func (s *Store) read(ctx context.Context, c redis.Cmdable, keys []string) ([]*idemstore.Record, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	pipe := c.Pipeline()
	cmds := make([]*redis.SliceCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.HMGet(ctx, k, fieldNames[:]...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, interpretError(ctx, err)
	}
	recs := make([]*idemstore.Record, len(keys))
	for i, cmd := range cmds {
		rec, err := decodeRecord(cmd.Val())
		if err != nil {
			return nil, fmt.Errorf("%w (key %s)", err, keys[i])
		}
		recs[i] = rec
	}
	return recs, nil
}

// List pages through the store's records, optionally filtered by state.
// Records come in SCAN order (by node, then by batch, then by key), which
// is stable while the keyspace does not change; the cursor is opaque.
func (s *Store) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	p = p.Normalize()
	if p.State != "" && !p.State.Valid() {
		return idemstore.ListPage{}, fmt.Errorf("idemredis: unknown state %q", p.State)
	}
	from, err := decodePosition(p.Cursor)
	if err != nil {
		return idemstore.ListPage{}, err
	}
	var (
		page idemstore.ListPage
		last position
		more bool
	)
	err = s.walk(ctx, from, func(pos position, rec *idemstore.Record) bool {
		if p.State != "" && rec.State != p.State {
			return true
		}
		if len(page.Records) == p.Limit {
			more = true
			return false
		}
		page.Records = append(page.Records, rec)
		last = pos
		return true
	})
	if err != nil {
		return idemstore.ListPage{}, err
	}
	if more {
		page.NextCursor = last.encode()
	}
	return page, nil
}

// ListExpiredLeases returns up to limit pending records whose lease expired
// at or before now. A limit of zero or less means 100.
func (s *Store) ListExpiredLeases(ctx context.Context, now time.Time, limit int) ([]*idemstore.Record, error) {
	limit = idemstore.ListParams{Limit: limit}.Normalize().Limit
	var out []*idemstore.Record
	err := s.walk(ctx, position{}, func(_ position, rec *idemstore.Record) bool {
		if rec.State == idemstore.StatePending && !rec.LeaseUntil.After(now) {
			out = append(out, rec)
		}
		return len(out) < limit
	})
	return out, err
}

// Purge deletes completed records whose expires_at is at or before
// p.Before. It scans every master once and sends the conditional deletes in
// pipelines of at most p.BatchSize scripts. Records whose Redis TTL already
// ran out are gone without being counted.
func (s *Store) Purge(ctx context.Context, p idemstore.PurgeParams) (int, error) {
	p = p.Normalize()
	nodes, err := s.masters(ctx)
	if err != nil {
		return 0, err
	}
	before := micros(p.Before)
	if before == "" {
		return 0, nil
	}
	total := 0
	for _, n := range nodes {
		if err := purgeScript.Load(ctx, n.client).Err(); err != nil {
			return total, interpretError(ctx, err)
		}
		var cursor uint64
		for {
			keys, next, err := n.client.ScanType(ctx, cursor, s.match, int64(s.cfg.ScanCount), "hash").Result()
			if err != nil {
				return total, interpretError(ctx, err)
			}
			for chunk := range slices.Chunk(keys, p.BatchSize) {
				deleted, err := s.purgeBatch(ctx, n.client, chunk, before)
				total += deleted
				if err != nil {
					return total, err
				}
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return total, nil
}

func (s *Store) purgeBatch(ctx context.Context, c redis.Cmdable, keys []string, before string) (int, error) {
	pipe := c.Pipeline()
	cmds := make([]*redis.Cmd, len(keys))
	for i, k := range keys {
		cmds[i] = purgeScript.EvalSha(ctx, pipe, []string{k}, before)
	}
	_, err := pipe.Exec(ctx)
	deleted := 0
	for _, cmd := range cmds {
		if n, _ := cmd.Int64(); n == 1 {
			deleted++
		}
	}
	return deleted, interpretError(ctx, err)
}

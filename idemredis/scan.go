package idemredis

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// Listing works by SCAN with MATCH "<prefix>:{*}:r" on every master (on a
// Cluster, the masters by CLUSTER SLOTS, in address order), followed by
// one pipeline per SCAN batch of TIME and a GETRANGE of each record's
// first summaryBytes (state, lease and operation), and one pipeline of
// TIME and the whole records for those returned; records of an earlier
// version, hashes, are read with HMGET instead (see legacy.go). TIME comes from the node that holds the
// records, first in the pipeline: it is the node's clock at or just before
// the reads, which judge expiry and become the records' ReadAt. There is no index, so the
// scripts that change records stay single-key and single-round-trip; the
// price is that List, ListExpiredLeases and Purge read through every key of
// every master (see doc.go).
//
// The commands of the listings are read-only, which rueidis retries on a
// new connection when one breaks, and every one of them is pinned (never
// recycled into rueidis's pool): the broken connection's writer can still
// be reading a command when its retry succeeds and would recycle it, and a
// recycled command's memory is reused by the next command built.

// node is one master that holds part of the keyspace.
type node struct {
	addr   string
	client rueidis.Client
	// slots are the hash slots the master serves, as [first, last] ranges
	// (on a Cluster only).
	slots [][2]int64
}

// masters returns the nodes to scan, in a stable order: the client itself
// when it is not a Cluster client; on a Cluster, every master that serves
// slots by CLUSTER SLOTS, each through the client's own connection to it.
// A master the client does not know yet (promoted since the client last
// refreshed its view of the Cluster) is introduced to it by a command for a
// key in one of its slots, which the old owner answers with MOVED.
func (s *Store) masters(ctx context.Context) ([]node, error) {
	if s.client.Mode() != rueidis.ClientModeCluster {
		return []node{{client: s.client}}, nil
	}
	for introduced := false; ; introduced = true {
		nodes, err := s.clusterMasters(ctx)
		if err != nil {
			return nil, err
		}
		unknown := slices.DeleteFunc(slices.Clone(nodes), func(n node) bool { return n.client != nil })
		if len(unknown) == 0 {
			return nodes, nil
		}
		if introduced {
			return nil, fmt.Errorf("idemredis: master %s is not known to the Cluster client yet: %w", unknown[0].addr, idemstore.ErrRetryable)
		}
		for _, n := range unknown {
			_ = s.client.Do(ctx, s.client.B().Exists().Key(keyInSlot(n.slots[0][0])).Build().Pin()).Error()
		}
	}
}

// clusterMasters asks CLUSTER SLOTS of the first node (by address) that
// answers and returns the masters it names, sorted by address, with the
// client's connection to each (nil for one the client does not know).
func (s *Store) clusterMasters(ctx context.Context) ([]node, error) {
	known := s.client.Nodes()
	err := errors.New("idemredis: the Cluster client knows no node")
	for _, addr := range slices.Sorted(maps.Keys(known)) {
		c := known[addr]
		var entries []rueidis.RedisMessage
		if entries, err = c.Do(ctx, c.B().ClusterSlots().Build().Pin()).ToArray(); err == nil {
			return parseClusterSlots(entries, addr, known)
		}
	}
	return nil, interpretError(ctx, err)
}

// parseClusterSlots reads a CLUSTER SLOTS reply, given by the node at
// asked, into the masters it names, sorted by address, with the clients of
// known.
func parseClusterSlots(entries []rueidis.RedisMessage, asked string, known map[string]rueidis.Client) ([]node, error) {
	bad := func(err error) error { return fmt.Errorf("idemredis: unexpected CLUSTER SLOTS reply: %w", err) }
	byAddr := map[string]*node{}
	for _, e := range entries {
		f, err := e.ToArray()
		if err == nil && len(f) < 3 {
			err = errors.New("short entry")
		}
		if err != nil {
			return nil, bad(err)
		}
		first, err1 := f[0].AsInt64()
		last, err2 := f[1].AsInt64()
		m, err3 := f[2].ToArray()
		if err := errors.Join(err1, err2, err3); err != nil || len(m) < 2 {
			return nil, bad(cmp.Or(err, errors.New("short node")))
		}
		host, _ := m[0].ToString()
		port, err := m[1].AsInt64()
		if err != nil {
			return nil, bad(err)
		}
		if host == "" { // the node that answered
			host, _, _ = net.SplitHostPort(asked)
		}
		addr := net.JoinHostPort(host, strconv.FormatInt(port, 10))
		n := byAddr[addr]
		if n == nil {
			n = &node{addr: addr, client: known[addr]}
			byAddr[addr] = n
		}
		n.slots = append(n.slots, [2]int64{first, last})
	}
	nodes := make([]node, 0, len(byAddr))
	for _, addr := range slices.Sorted(maps.Keys(byAddr)) {
		nodes = append(nodes, *byAddr[addr])
	}
	return nodes, nil
}

// keyInSlot returns a short key in the Cluster hash slot, "" if it finds
// none (every slot has one of at most six digits: 0 to 109757 cover them
// all).
func keyInSlot(slot int64) string {
	for i := range 1_000_000 {
		if k := strconv.Itoa(i); int64(crc16(k)%16384) == slot {
			return k
		}
	}
	return ""
}

// crc16 is the Cluster's key hash, CRC-16/XMODEM (polynomial 0x1021).
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// scan runs one SCAN step of this store's record keys on the node c.
func (s *Store) scan(ctx context.Context, c rueidis.Client, cursor uint64) (keys []string, next uint64, err error) {
	e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match(s.match).Count(int64(s.cfg.ScanCount)).Build().Pin()).AsScanEntry()
	if err != nil {
		return nil, 0, interpretError(ctx, err)
	}
	return e.Elements, e.Cursor, nil
}

// scanAll calls fn with every SCAN batch of record keys of every master,
// master by master, until the last batch or fn's first error.
func (s *Store) scanAll(ctx context.Context, fn func(n node, keys []string) error) error {
	nodes, err := s.masters(ctx)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		for cursor := uint64(0); ; {
			keys, next, err := s.scan(ctx, n.client, cursor)
			if err != nil {
				return err
			}
			if err := fn(n, keys); err != nil {
				return err
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return nil
}

// serverTime decodes a TIME reply.
func serverTime(res rueidis.RedisResult) (time.Time, error) {
	v, err := res.AsStrSlice()
	if err != nil {
		return time.Time{}, err
	}
	if len(v) != 2 {
		return time.Time{}, fmt.Errorf("idemredis: TIME returned %d values", len(v))
	}
	sec, err1 := strconv.ParseInt(v[0], 10, 64)
	usec, err2 := strconv.ParseInt(v[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return time.Time{}, fmt.Errorf("idemredis: bad TIME %q: %w", v, err)
	}
	return time.Unix(sec, usec*1000).UTC(), nil
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
	node       rueidis.Client
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
			keys, next, err := s.scan(ctx, nodes[i].client, cursor)
			if err != nil {
				return err
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

// summaryBytes is how much of each record the first pass of a listing
// reads (GETRANGE): the head, the token and, unless they are unusually
// long, the operation. A record whose operation ends further on is read
// whole.
const summaryBytes = 512

// summaries reads the state, lease deadline and operation of the records
// under keys, after the node's TIME, in one pipeline of GETRANGE, and a
// second one for the records that need more: HMGET for a hash (a record
// of an earlier version, see legacy.go), GET for a string whose operation
// ended past summaryBytes. A key that vanished since the SCAN, or that
// holds neither a string nor a hash, yields nil.
func (s *Store) summaries(ctx context.Context, c rueidis.Client, keys []string) ([]*summary, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	cmds := make(rueidis.Commands, 0, 1+len(keys))
	cmds = append(cmds, c.B().Time().Build().Pin())
	for _, k := range keys {
		cmds = append(cmds, c.B().Getrange().Key(k).Start(0).End(summaryBytes-1).Build().Pin())
	}
	res := c.DoMulti(ctx, cmds...)
	now, err := serverTime(res[0])
	if err != nil {
		return nil, interpretError(ctx, err)
	}
	out := make([]*summary, len(keys))
	var again []int
	for i, r := range res[1:] {
		v, err := r.ToString()
		switch {
		case isWrongType(err):
			again = append(again, i)
			continue
		case err != nil:
			return nil, interpretError(ctx, err)
		case v == "":
			continue // gone since the SCAN
		}
		sum, ok, err := summaryOf(v)
		if err == nil && !ok && len(v) < summaryBytes {
			err = errCorruptRecord // the whole record, and it ends early
		}
		if err != nil {
			return nil, fmt.Errorf("%w (key %s)", err, keys[i])
		}
		if !ok {
			again = append(again, i)
			continue
		}
		sum.now = now
		out[i] = &sum
	}
	if len(again) == 0 {
		return out, nil
	}
	cmds = cmds[:0]
	for _, i := range again {
		if res[1+i].Error() != nil {
			cmds = append(cmds, c.B().Hmget().Key(keys[i]).Field(hashFields[fState], hashFields[fLeaseUntil], hashFields[fOperation]).Build().Pin())
		} else {
			cmds = append(cmds, c.B().Get().Key(keys[i]).Build().Pin())
		}
	}
	for j, r := range c.DoMulti(ctx, cmds...) {
		i := again[j]
		sum, err := summaryAgain(r)
		if err != nil {
			return nil, interpretError(ctx, fmt.Errorf("%w (key %s)", err, keys[i]))
		}
		if sum != nil {
			sum.now = now
			out[i] = sum
		}
	}
	return out, nil
}

// summaryAgain decodes the reply of the second pass of summaries: a whole
// record, or the state, lease deadline and operation of a hash. It returns
// nil for a record that is gone and for a key of another type.
func summaryAgain(r rueidis.RedisResult) (*summary, error) {
	if err := r.Error(); err != nil {
		if rueidis.IsRedisNil(err) || isWrongType(err) {
			return nil, nil
		}
		return nil, err
	}
	if v, err := r.ToString(); err == nil {
		if v == "" {
			return nil, nil
		}
		rec, err := decodeRecord(v, time.Time{})
		if err != nil {
			return nil, err
		}
		return &summary{state: rec.State, operation: rec.Key.Operation, leaseUntil: rec.LeaseUntil}, nil
	}
	v, err := r.ToArray()
	if err != nil || len(v) != 3 {
		return nil, fmt.Errorf("idemredis: unexpected HMGET reply: %v", err)
	}
	st, err := v[0].ToString()
	if err != nil {
		return nil, nil // gone since the SCAN
	}
	lu, _ := v[1].ToString()
	lease, err := parseMicros(lu)
	if err != nil {
		return nil, fmt.Errorf("idemredis: bad lease_until: %w", err)
	}
	op, _ := v[2].ToString()
	return &summary{state: idemstore.State(st), operation: op, leaseUntil: lease}, nil
}

// isWrongType reports whether err is Redis's WRONGTYPE: the key holds a
// hash (a record of an earlier version) or another type.
func isWrongType(err error) bool {
	var re *rueidis.RedisError
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "WRONGTYPE")
}

// firstError returns the first error among the results of a pipeline
// other than a nil reply.
func firstError(res []rueidis.RedisResult) error {
	for _, r := range res {
		if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
			return err
		}
	}
	return nil
}

// fetch reads the whole records of hits, one pipeline (the node's TIME,
// then a GET per record) per node, and a second one of HMGET for the
// hashes among them (records of an earlier version), and keeps, in the
// order of hits, those that still exist and that keep still accepts (a
// record can change between the two passes). Each record's ReadAt is its
// node's TIME.
func (s *Store) fetch(ctx context.Context, hits []hit, keep func(summary) bool) ([]*idemstore.Record, error) {
	recs := make([]*idemstore.Record, len(hits))
	done := make([]bool, len(hits))
	for first := range hits {
		if done[first] {
			continue
		}
		node, c := hits[first].pos.node, hits[first].node
		cmds := rueidis.Commands{c.B().Time().Build().Pin()}
		var idx []int
		for i := first; i < len(hits); i++ {
			if !done[i] && hits[i].pos.node == node {
				done[i] = true
				idx = append(idx, i)
				cmds = append(cmds, c.B().Get().Key(hits[i].pos.key).Build().Pin())
			}
		}
		res := c.DoMulti(ctx, cmds...)
		now, err := serverTime(res[0])
		if err != nil {
			return nil, interpretError(ctx, err)
		}
		var hashes []int
		for j, r := range res[1:] {
			i := idx[j]
			v, err := r.ToString()
			switch {
			case isWrongType(err):
				hashes = append(hashes, i)
				continue
			case rueidis.IsRedisNil(err):
				continue // gone since the first pass
			case err != nil:
				return nil, interpretError(ctx, err)
			}
			rec, err := decodeRecord(v, now)
			if err != nil {
				return nil, fmt.Errorf("%w (key %s)", err, hits[i].pos.key)
			}
			recs[i] = rec
		}
		if len(hashes) > 0 {
			cmds = cmds[:0]
			for _, i := range hashes {
				cmds = append(cmds, c.B().Hmget().Key(hits[i].pos.key).Field(hashFields[:]...).Build().Pin())
			}
			for j, r := range c.DoMulti(ctx, cmds...) {
				i := hashes[j]
				vals, err := r.ToArray()
				if isWrongType(err) {
					continue // neither a string nor a hash
				}
				if err != nil {
					return nil, interpretError(ctx, err)
				}
				if recs[i], err = decodeHash(vals, now); err != nil {
					return nil, fmt.Errorf("%w (key %s)", err, hits[i].pos.key)
				}
			}
		}
		for _, i := range idx {
			if rec := recs[i]; rec != nil && !keep(summary{state: rec.State, operation: rec.Key.Operation, leaseUntil: rec.LeaseUntil, now: now}) {
				recs[i] = nil
			}
		}
	}
	return slices.DeleteFunc(recs, func(r *idemstore.Record) bool { return r == nil }), nil
}

// scanList is List without a search field: it pages through the store's
// records, optionally filtered by state and operation, by SCAN, so that it
// lists records of an earlier version that no index holds yet too.
// Records come in SCAN order (by node, then by batch, then by key), which
// is stable while the keyspace does not change; the cursor is opaque. A
// page reads the state and operation of every record it passes over but
// the whole record only of those it returns.
func (s *Store) scanList(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
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
// record), so it may return fewer than limit while more are expired. It
// checks the nodes' maxmemory-policy first (see CheckPolicy).
func (s *Store) ListExpiredLeases(ctx context.Context, limit int) ([]*idemstore.Record, error) {
	s.recheck(ctx)
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

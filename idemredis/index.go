package idemredis

import (
	"strconv"
	"strings"
	"sync"

	"github.com/idem-dev/idem/idemstore"
)

// The search indexes (see "Search" in doc.go) are sorted sets kept by the
// scripts that change records, in the same atomic step. A script may only
// touch keys of its record's Cluster slot, so on a Cluster each of the
// 16384 slots has its own indexes, named after a short tag that hashes to
// that slot (slotTag), and a search asks every slot, pipelined; on a
// single node (or behind Sentinel) there is one group of indexes, that of
// slot 0. Each group has four sets, <prefix>:{<slot tag>}:i and a letter:
//
//	ik  every record, score 0, member keyMember: by key value, scope and
//	    operation, for a search by key or key prefix (ZRANGEBYLEX)
//	ia  every record by age, member ageMember, scored by created-at, less
//	    pendingShift while the record is pending: the pending records are
//	    the scores below 0, the others those from 0 on, each range in
//	    order of age (listings by age of every state, pending records,
//	    completed ones, and the overview's counts)
//	iv  needs_review records, as ia: the review queue by age
//	il  records with a scope label, score 0, member labelMember: a search
//	    by label (the label's ScopeLabelIndex), in scope, operation, key order
//
// One set by age rather than one per state spares a command per request:
// Reserve adds to ik and ia, and Complete changes the record's score in
// ia, where a set of pending records would cost an add and a removal.
//
// Members hold the key's parts, each escaped (esc) so that NUL can
// separate them and byte order is kept: a search reads keys from the
// index alone, and a record's Redis key follows from its key (hashTag).

// pendingShift is 2^52, taken off a pending record's created-at (Unix
// microseconds, far below it) for its score in the set by age: the
// result is negative and, like every integer under 2^53, exact in the
// doubles that scores and Lua numbers are.
const (
	pendingShift      = "4503599627370496"
	pendingShiftFloat = float64(1 << 52)
)

// numSlots is the number of Cluster hash slots.
const numSlots = 16384

// slotTags returns, for each slot, the shortest decimal string that
// hashes to it (0 to 109757 cover every slot).
var slotTags = sync.OnceValue(func() []string {
	tags := make([]string, numSlots)
	for i, left := 0, numSlots; left > 0; i++ {
		k := strconv.Itoa(i)
		if slot := crc16(k) % numSlots; tags[slot] == "" {
			tags[slot] = k
			left--
		}
	}
	return tags
})

// slotTag returns a string whose Cluster hash slot is slot.
func slotTag(slot int) string { return slotTags()[slot] }

// indexes are the names of one group's index sets.
type indexes struct{ key, all, review, label string }

// group returns the index group of a record with hash tag tag: its slot
// on a Cluster, else 0.
func (s *Store) group(tag string) int {
	if !s.cluster {
		return 0
	}
	return int(crc16(tag) % numSlots)
}

// groups is how many index groups a search asks.
func (s *Store) groups() int {
	if !s.cluster {
		return 1
	}
	return numSlots
}

// indexes returns the index sets of group g.
func (s *Store) indexes(g int) indexes {
	base := s.cfg.Prefix + ":{" + slotTag(g) + "}:i"
	return indexes{key: base + "k", all: base + "a", review: base + "v", label: base + "l"}
}

// esc escapes s for a member: 0x01 becomes 0x01 0x02 and NUL 0x01 0x01,
// so NUL can end a part, and escaped strings sort as the strings do.
func esc(s string) string {
	if strings.IndexByte(s, 0) < 0 && strings.IndexByte(s, 1) < 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case 0:
			b.WriteString("\x01\x01")
		case 1:
			b.WriteString("\x01\x02")
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// unesc reverses esc.
func unesc(s string) string {
	if strings.IndexByte(s, 1) < 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 1 && i+1 < len(s) {
			i++
			b.WriteByte(s[i] - 1)
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// keyMember is a record's member of the key index: key, scope, operation.
func keyMember(k idemstore.Key) string {
	return esc(k.Key) + "\x00" + esc(k.Scope) + "\x00" + esc(k.Operation)
}

// ageMember is a record's member of the sets by age: scope, operation,
// key, the order of a tie.
func ageMember(k idemstore.Key) string {
	return esc(k.Scope) + "\x00" + esc(k.Operation) + "\x00" + esc(k.Key)
}

// labelMember is a record's member of the label index.
func labelMember(labelIndex string, k idemstore.Key) string {
	return esc(labelIndex) + "\x00" + ageMember(k)
}

// parseKeyMember reverses keyMember.
func parseKeyMember(m string) (idemstore.Key, bool) {
	p := strings.Split(m, "\x00")
	if len(p) != 3 {
		return idemstore.Key{}, false
	}
	return idemstore.Key{Key: unesc(p[0]), Scope: unesc(p[1]), Operation: unesc(p[2])}, true
}

// parseAgeMember reverses ageMember.
func parseAgeMember(m string) (idemstore.Key, bool) {
	p := strings.Split(m, "\x00")
	if len(p) != 3 {
		return idemstore.Key{}, false
	}
	return idemstore.Key{Scope: unesc(p[0]), Operation: unesc(p[1]), Key: unesc(p[2])}, true
}

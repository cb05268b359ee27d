package idemredis

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// Config configures a Store. The zero value is usable.
type Config struct {
	// Prefix starts every key and channel name the store uses, so that
	// several stores (or tests) can share one Redis. It must not contain
	// '{' or '}', which would break the hash tag. Defaults to "idem".
	Prefix string

	// RetentionGrace is added to a completed record's retention to get its
	// Redis TTL (a negative retention counts as zero, so the TTL is never
	// shorter than the grace). Until the TTL ends the record stays readable
	// and Purge can still remove it; after that Redis drops it on its own.
	// Defaults to 1h.
	RetentionGrace time.Duration

	// ClassicPubSub makes the store publish and subscribe with PUBLISH and
	// SUBSCRIBE instead of sharded pub/sub (SPUBLISH and SSUBSCRIBE, which
	// need Redis 7.0 or later). Classic messages are broadcast to every
	// node of a Cluster. Defaults to false.
	ClassicPubSub bool

	// ScanCount is the COUNT hint of the SCAN calls behind List,
	// ListExpiredLeases and Purge. Defaults to 500.
	ScanCount int

	// Resends is how many times a script whose reply was lost (the
	// connection broke or timed out after it was sent) is sent again. A
	// resent script recognises its own earlier run by the call's token or
	// call id and reports success (see "Lost replies" in the package
	// documentation). The store resends with its own backoff of 8ms
	// doubling to 512ms, within ctx; the client's own retries (rueidis
	// retries only read-only commands) are not used for scripts. Defaults
	// to 3; -1 sends each script once and reports a lost reply as
	// idemstore.ErrUnavailable.
	Resends int

	// MaxmemoryPolicy states the maxmemory-policy of the Redis nodes, for
	// servers that do not tell it: managed services (ElastiCache,
	// Memorystore, Azure Cache for Redis, …) disable or rename CONFIG, and
	// an ACL user may lack the right to run it. New reads the policy of
	// every node with CONFIG GET and refuses any but noeviction, which is
	// the only policy under which Redis never evicts a record before its
	// retention (see "Eviction" in the package documentation). Where CONFIG
	// GET is refused, New takes this setting instead, refuses it unless it
	// is noeviction, and logs a warning that the policy was not verified.
	// Where CONFIG GET answers, the node's answer counts and a different
	// value here is logged as a warning. The value is one of Redis's policy
	// names, in any case. Defaults to "": a node that does not tell its
	// policy makes New fail with ErrPolicyUnknown.
	MaxmemoryPolicy string

	// Logger receives the warnings of the policy checks (a policy stated
	// but not verified, a replica that could not be asked) and their
	// changes at run time. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = "idem"
	}
	if c.RetentionGrace == 0 {
		c.RetentionGrace = time.Hour
	}
	if c.ScanCount == 0 {
		c.ScanCount = 500
	}
	if c.Resends == 0 {
		c.Resends = 3
	}
	c.MaxmemoryPolicy = strings.ToLower(strings.TrimSpace(c.MaxmemoryPolicy))
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports what New would find wrong with c, defaults applied,
// without a client: a Prefix with '{' or '}', a MaxmemoryPolicy that is
// not a Redis policy name, and the other fields' bounds.
func (c Config) Validate() error { return c.withDefaults().validate() }

func (c Config) validate() error {
	if strings.ContainsAny(c.Prefix, "{}") {
		return fmt.Errorf("idemredis: Prefix %q must not contain '{' or '}'", c.Prefix)
	}
	if c.RetentionGrace < time.Millisecond {
		return fmt.Errorf("idemredis: RetentionGrace %v must be at least 1ms", c.RetentionGrace)
	}
	if c.ScanCount < 1 {
		return fmt.Errorf("idemredis: ScanCount %d must be positive", c.ScanCount)
	}
	if c.Resends < -1 {
		return fmt.Errorf("idemredis: Resends %d must be -1 (none) or more", c.Resends)
	}
	if c.MaxmemoryPolicy != "" && !slices.Contains(policies, c.MaxmemoryPolicy) {
		return fmt.Errorf("idemredis: MaxmemoryPolicy %q is not a Redis maxmemory-policy (%s)", c.MaxmemoryPolicy, strings.Join(policies, ", "))
	}
	return nil
}

// Store is an idemstore.Store kept in Redis, standalone or Cluster. It is
// safe for concurrent use.
type Store struct {
	client rueidis.Client
	cfg    Config
	// match is the SCAN pattern that selects this store's record keys.
	match string
	// callID returns the id that tells a resent script from a new call
	// (see resend.go), callIDLen bytes long; tests replace it to resend a
	// call.
	callID func() string
	// refusal is why new reservations are refused: the error of the last
	// policy check that found a node whose maxmemory-policy can evict
	// records or is unknown; nil while the last check found every node
	// safe (see policy.go).
	refusal atomic.Pointer[error]
	// cluster is set for a Cluster client: the search indexes are kept
	// per slot (see index.go).
	cluster bool
}

var (
	_ idemstore.Store    = (*Store)(nil)
	_ idemstore.Notifier = (*Store)(nil)
)

// New returns a Store that keeps its records through client, a rueidis
// client for a single node, a Cluster or a Sentinel-managed master (see the
// package documentation for building one from a redis:// URL). The caller
// keeps ownership of client and closes it after the last use of the Store.
//
// Every read by key and every state change is a script (EVALSHA), which
// rueidis always sends to the master that owns the record's slot, whatever
// ClientOption.SendToReplicas says. Do not build the client with
// ReplicaOnly: its scripts would reach replicas, which refuse them.
//
// New asks every node (on a Cluster, every master and replica) for its
// maxmemory-policy and fails with an error wrapping ErrEvictionPolicy
// unless every one is noeviction, or with ErrPolicyUnknown when a node does
// not tell and Config.MaxmemoryPolicy does not state it (see "Eviction" in
// the package documentation). It fails with an error wrapping
// idemstore.ErrUnavailable when a master cannot be asked within
// policyCheckTimeout.
func New(client rueidis.Client, cfg Config) (*Store, error) {
	s, err := newStore(client, cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), policyCheckTimeout)
	defer cancel()
	if err := s.checkAtStart(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// newStore is New without the policy check.
func newStore(client rueidis.Client, cfg Config) (*Store, error) {
	if client == nil {
		return nil, errors.New("idemredis: nil client")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Store{
		client: client, cfg: cfg, match: globEscape(cfg.Prefix) + ":{*}:r", callID: newCallID,
		cluster: client.Mode() == rueidis.ClientModeCluster,
	}, nil
}

// Capabilities reports that the store can wake waiters (pub/sub) and
// search (see "Search" in the package documentation), but has no
// transactional complete.
func (s *Store) Capabilities() idemstore.Capabilities {
	return idemstore.Capabilities{Notify: true, Search: true}
}

// hashTag returns the hash tag content of a key: the hex SHA-256 of the
// length-prefixed scope, operation and key. Length prefixes make the
// encoding injective, so no choice of strings can collide, and hex keeps '{'
// and '}' out of the tag.
func hashTag(k idemstore.Key) string {
	b := make([]byte, 0, 3*binary.MaxVarintLen64+len(k.Scope)+len(k.Operation)+len(k.Key))
	for _, s := range [...]string{k.Scope, k.Operation, k.Key} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// keys are the Redis names of one record that its changing scripts take:
// the string <prefix>:{<tag>}:r, its tombstone <prefix>:{<tag>}:g (see
// resend.go) and the scratch key <prefix>:{<tag>}:t in which Complete
// builds a large record (see completeScript), which no longer exists once
// a script ends. Its notification channel is <prefix>:{<tag>}:n. All of
// them share the tag and so the Cluster slot, which lets one script touch
// the keys and SPUBLISH to the channel.
// ix are the index sets of the record's group (see index.go), in the
// same slot.
type keys struct {
	record, tombstone, scratch string
	ix                         indexes
}

func (s *Store) keys(k idemstore.Key) keys {
	tag := hashTag(k)
	base := s.cfg.Prefix + ":{" + tag + "}:"
	return keys{record: base + "r", tombstone: base + "g", scratch: base + "t", ix: s.indexes(s.group(tag))}
}

// indexed returns the record, its tombstone and the indexes that unindex
// (scripts.go) takes, in that order, then the label index.
func (k keys) indexed() []string {
	return []string{k.record, k.tombstone, k.ix.key, k.ix.all, k.ix.review, k.ix.label}
}

// base is the record's names without their last letter.
func (s *Store) base(k idemstore.Key) string { return s.cfg.Prefix + ":{" + hashTag(k) + "}:" }

func (s *Store) recordKey(k idemstore.Key) string { return s.base(k) + "r" }

func (s *Store) channel(k idemstore.Key) string { return s.base(k) + "n" }

// globEscape escapes the characters that SCAN MATCH treats specially.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

package idemredis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// Under memory pressure Redis evicts keys as its maxmemory-policy says:
// the volatile-* policies evict keys that carry a TTL, as every completed
// record does (its retention), and the allkeys-* policies any key, pending
// and needs_review records included. An evicted record is a key the next
// retry reserves anew: the operation runs twice. Only noeviction never
// evicts; a full server then refuses writes with OOM, which the store
// reports as idemstore.ErrUnavailable, so requests get 503 and nothing runs
// twice.
//
// The store therefore accepts noeviction only, whatever maxmemory says
// (a limit of 0 never evicts, but CONFIG SET maxmemory evicts down to the
// new limit at once). It asks every node with CONFIG GET: on a Cluster,
// every master that serves slots and every other node the client knows
// (replicas, whose policy takes effect when they are promoted). New refuses
// a node with another policy; CheckPolicy checks again (ListExpiredLeases
// and Purge call it before they scan), and while the last check found one,
// Reserve and Takeover fail with ErrUnavailable, so that no request is
// acquired that an evicted record might already have answered. Replays
// go through Reserve too, and fail with it.

// safePolicy is the one maxmemory-policy under which Redis never evicts.
const safePolicy = "noeviction"

// policies are the maxmemory-policy values Redis knows.
var policies = []string{safePolicy, "allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"}

// policyCheckTimeout bounds New's check of the policy.
const policyCheckTimeout = 10 * time.Second

var (
	// ErrEvictionPolicy is wrapped by the error of New and CheckPolicy, and
	// by that of Reserve and Takeover while the last check found it, when a
	// node's maxmemory-policy (read with CONFIG GET, or stated by
	// Config.MaxmemoryPolicy where CONFIG GET is refused) is not
	// noeviction: Redis may evict records before their retention.
	ErrEvictionPolicy = errors.New("idemredis: the Redis maxmemory-policy can evict records")

	// ErrPolicyUnknown is wrapped by the same errors when a node refuses
	// CONFIG GET (disabled, renamed, or not permitted to the user) and
	// Config.MaxmemoryPolicy does not state the policy.
	ErrPolicyUnknown = errors.New("idemredis: the Redis maxmemory-policy is unknown")
)

// policyTarget is a node whose policy is checked.
type policyTarget struct {
	addr   string
	role   string // "node" (not a Cluster), "master" or "other node"
	client rueidis.Client
}

func (t policyTarget) String() string {
	if t.addr == "" {
		return "the Redis " + t.role
	}
	return t.role + " " + t.addr
}

// nodePolicy is what one node said of its policy.
type nodePolicy struct {
	target policyTarget
	// policy is the node's maxmemory-policy in lower case; "" when the
	// node did not tell.
	policy string
	// refused says why the node did not tell: CONFIG GET's error reply, or
	// a reply without the policy.
	refused error
}

// policyTargets returns the nodes to check: every node of the client when
// it is not a Cluster client (one, or a Sentinel master and replica); on a
// Cluster, the masters that serve slots, then every other node the client
// knows, by address.
func (s *Store) policyTargets(ctx context.Context) ([]policyTarget, error) {
	known := s.client.Nodes()
	if s.client.Mode() != rueidis.ClientModeCluster {
		if len(known) == 0 {
			return []policyTarget{{role: "node", client: s.client}}, nil
		}
		targets := make([]policyTarget, 0, len(known))
		for _, addr := range slices.Sorted(maps.Keys(known)) {
			targets = append(targets, policyTarget{addr, "node", known[addr]})
		}
		return targets, nil
	}
	masters, err := s.masters(ctx)
	if err != nil {
		return nil, err
	}
	targets := make([]policyTarget, 0, len(known))
	for _, m := range masters {
		targets = append(targets, policyTarget{m.addr, "master", m.client})
		delete(known, m.addr)
	}
	for _, addr := range slices.Sorted(maps.Keys(known)) {
		targets = append(targets, policyTarget{addr, "other node", known[addr]})
	}
	return targets, nil
}

// readPolicies asks every target for its policy. A master (or the one
// node) that cannot be asked fails the read; another node of a Cluster
// that cannot be asked is returned in skipped, as it holds no records now.
func (s *Store) readPolicies(ctx context.Context) (reports []nodePolicy, skipped []error, err error) {
	targets, err := s.policyTargets(ctx)
	if err != nil {
		return nil, nil, err
	}
	for _, t := range targets {
		policy, refused, err := readPolicy(ctx, t.client)
		if err != nil {
			err = fmt.Errorf("idemredis: reading the maxmemory-policy of %s: %w", t, err)
			if t.role == "other node" {
				skipped = append(skipped, err)
				continue
			}
			return nil, nil, err
		}
		reports = append(reports, nodePolicy{t, policy, refused})
	}
	return reports, skipped, nil
}

// readPolicy asks one node for its maxmemory-policy. A node that answers
// CONFIG GET with an error reply (an unknown command when CONFIG is
// disabled or renamed, NOPERM when the user may not run it) or without the
// policy has refused; err is set only when the node could not be asked.
// The reply's name is matched in any case (a reply that names the policy
// twice, differently, has refused), and the policy is returned in lower
// case.
func readPolicy(ctx context.Context, c rueidis.Client) (policy string, refused, err error) {
	return policyReply(ctx, c.Do(ctx, c.B().ConfigGet().Parameter("maxmemory-policy").Build().Pin()))
}

// policyReply reads the reply to CONFIG GET maxmemory-policy as
// readPolicy returns it: a RESP3 map or a RESP2 array of names and values.
func policyReply(ctx context.Context, res rueidis.RedisResult) (policy string, refused, err error) {
	if err := res.Error(); err != nil {
		interpreted := interpretError(ctx, err)
		if _, reply := rueidis.IsRedisErr(err); reply && !errors.Is(interpreted, idemstore.ErrUnavailable) && !errors.Is(interpreted, idemstore.ErrRetryable) {
			return "", err, nil
		}
		return "", nil, interpreted
	}
	values, err := res.AsStrMap()
	if err != nil {
		return "", fmt.Errorf("unexpected reply to CONFIG GET: %w", err), nil
	}
	for name, v := range values {
		if !strings.EqualFold(name, "maxmemory-policy") {
			continue
		}
		switch p := strings.ToLower(strings.TrimSpace(v)); {
		case p == "":
		case policy == "" || policy == p:
			policy = p
		default:
			return "", fmt.Errorf("CONFIG GET named maxmemory-policy twice, as %s and %s", policy, p), nil
		}
	}
	if policy == "" {
		return "", errors.New("CONFIG GET maxmemory-policy answered without it"), nil
	}
	return policy, nil, nil
}

// judge returns an error wrapping ErrEvictionPolicy or ErrPolicyUnknown
// for each node whose policy, told or stated by Config.MaxmemoryPolicy, is
// not noeviction; nil when there is none.
func (s *Store) judge(reports []nodePolicy) error {
	var errs []error
	for _, r := range reports {
		policy, source := r.policy, "CONFIG GET"
		if policy == "" {
			if s.cfg.MaxmemoryPolicy == "" {
				errs = append(errs, fmt.Errorf("%w: %s does not tell its maxmemory-policy (%v); state it with Config.MaxmemoryPolicy (maxmemory_policy=noeviction in a store URL) once it is noeviction", ErrPolicyUnknown, r.target, r.refused))
				continue
			}
			policy, source = s.cfg.MaxmemoryPolicy, "Config.MaxmemoryPolicy, as CONFIG GET is refused"
		}
		if policy != safePolicy {
			errs = append(errs, fmt.Errorf("%w: %s has maxmemory-policy %s (by %s), %s; set it to noeviction", ErrEvictionPolicy, r.target, policy, source, evicts(policy)))
		}
	}
	return errors.Join(errs...)
}

// evicts says what policy evicts.
func evicts(policy string) string {
	switch {
	case strings.HasPrefix(policy, "volatile-"):
		return "which evicts completed records (they carry a TTL) when memory runs short"
	case strings.HasPrefix(policy, "allkeys-"):
		return "which evicts any record, pending and in review too, when memory runs short"
	}
	return "which idem does not know, and accepts noeviction only"
}

// checkAtStart is New's check: it fails on a policy that can evict or is
// unknown, and logs what it could not verify.
func (s *Store) checkAtStart(ctx context.Context) error {
	reports, skipped, err := s.readPolicies(ctx)
	if err != nil {
		return err
	}
	if err := s.judge(reports); err != nil {
		return err
	}
	log := s.cfg.Logger
	var unverified []string
	var why error
	for _, r := range reports {
		switch {
		case r.policy == "":
			unverified = append(unverified, r.target.String())
			why = cmp.Or(why, r.refused)
		case s.cfg.MaxmemoryPolicy != "" && r.policy != s.cfg.MaxmemoryPolicy:
			log.Warn("idemredis: Config.MaxmemoryPolicy differs from the policy the node reports; the node's counts",
				slog.String("node", r.target.String()), slog.String("stated", s.cfg.MaxmemoryPolicy), slog.String("reported", r.policy))
		}
	}
	if len(unverified) > 0 {
		log.Warn("idemredis: the Redis maxmemory-policy could not be verified (CONFIG GET refused); trusting the stated policy. Under any other policy than noeviction, Redis evicts records under memory pressure and retries run operations twice",
			slog.String("maxmemory_policy", s.cfg.MaxmemoryPolicy), slog.Any("nodes", unverified), slog.Any("error", why))
	}
	for _, err := range skipped {
		log.Warn("idemredis: a node of the Cluster could not be asked for its maxmemory-policy; it is asked again at the next check", slog.Any("error", err))
	}
	return nil
}

// CheckPolicy asks every node for its maxmemory-policy again, as New did:
// on a Cluster, the masters that serve slots now and every other node the
// client knows, so that a master added or promoted since is checked too.
// It returns an error wrapping ErrEvictionPolicy or ErrPolicyUnknown when a
// node's policy can evict records or is unknown; from then until a check
// finds every node safe again, Reserve and Takeover fail with an error
// wrapping idemstore.ErrUnavailable (the engine answers 503) and that
// error. A change either way is logged. A node that cannot be asked leaves
// things as they were and makes CheckPolicy return an error wrapping
// idemstore.ErrUnavailable.
//
// ListExpiredLeases and Purge call CheckPolicy before they scan, so a
// process that runs the engine's Recover or Purge loop (idem serve does,
// every minute and every five) checks that often. Call it from a health
// check to check more often.
func (s *Store) CheckPolicy(ctx context.Context) error {
	reports, _, err := s.readPolicies(ctx)
	if err != nil {
		return err
	}
	err = s.judge(reports)
	if err == nil {
		if s.refusal.Swap(nil) != nil {
			s.cfg.Logger.Info("idemredis: every node's maxmemory-policy is noeviction again; reservations resume")
		}
		return nil
	}
	if s.refusal.Swap(&err) == nil {
		s.cfg.Logger.Error("idemredis: a Redis node's maxmemory-policy can evict records; every reservation fails, replays included (503), until it is noeviction again",
			slog.Any("error", err))
	}
	return err
}

// recheck runs CheckPolicy for a listing that is about to scan; the
// listing's own calls report an unreachable node.
func (s *Store) recheck(ctx context.Context) { _ = s.CheckPolicy(ctx) }

// admit returns the error that refuses reservations while the last policy
// check found a node that can evict records, else nil.
func (s *Store) admit() error {
	if p := s.refusal.Load(); p != nil {
		return fmt.Errorf("idemredis: %w: reservations are refused: %w", idemstore.ErrUnavailable, *p)
	}
	return nil
}

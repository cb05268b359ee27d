package chaos

import (
	"bytes"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemproxy"
	"github.com/idem-dev/idem/idemstore"
)

// StoreKey is the record key the proxy keeps for k: the scope is the
// SHA-256 of the Authorization header (or the shared anonymous scope, as
// the chaos run starts idem serve with --anonymous shared), the
// operation method and path, at any host (host_aliases ["*"]), in front
// of the upstream named chaosUpstream.
func StoreKey(k ExecKey) idemstore.Key {
	r, _ := http.NewRequest(http.MethodPost, "http://proxy"+k.Path, nil)
	if k.Auth != "" {
		r.Header.Set("Authorization", k.Auth)
	}
	scope, _ := idemproxy.NewScope(idemproxy.ScopeSources{}, nil, idemproxy.AnonymousShared)(r)
	return idemstore.Key{Scope: scope, Operation: http.MethodPost + " " + k.Path + " host=* upstream=" + chaosUpstream, Key: k.Key}
}

// chaosUpstream is the upstream_name of the chaos run's proxies.
const chaosUpstream = "chaos"

// Violation is one broken invariant of one key.
type Violation struct {
	Key  ExecKey
	What string
}

// Report is what Check found.
type Report struct {
	Violations []Violation
	// Requests counts attempts; Operations the logical operations
	// (retried with one key); Keys the distinct keys.
	Requests, Operations, Keys int
	// Executions counts the upstream's executions with an effect;
	// NoEffect its 429 and 503 answers (the key was released).
	Executions, NoEffect int
	// Replays counts answers marked Idempotent-Replayed.
	Replays int
	// Completed, Reviews and Released count the keys' final records:
	// completed, needs_review, absent. Pending counts the records still
	// pending after recovery (each one is also a violation).
	Completed, Reviews, Released, Pending int
	// Duplicates counts keys the upstream executed more than once.
	Duplicates int
	// Statuses counts the answers by status (0: transport error).
	Statuses map[int]int

	execs    map[ExecKey][]Exec
	attempts map[ExecKey][]Attempt
	records  map[ExecKey]*idemstore.Record
}

// Check verifies, for every key: at most one upstream execution with an
// effect, and only with the key's own body; a final record that is
// completed with exactly the answer the upstream gave, needs_review, or
// absent only when the upstream never acted; and every answer that came
// from the upstream (replayed or not) byte-identical to that execution's
// answer. records holds each key's record after recovery, nil for absent.
func Check(execs map[ExecKey][]Exec, attempts []Attempt, records map[ExecKey]*idemstore.Record) *Report {
	r := &Report{Requests: len(attempts), Statuses: map[int]int{}, execs: execs, attempts: map[ExecKey][]Attempt{}, records: records}
	ops := map[int64]bool{}
	for _, a := range attempts {
		r.attempts[a.Key] = append(r.attempts[a.Key], a)
		r.Statuses[a.Status]++
		if !a.Verify {
			ops[a.Op] = true
		}
		if a.Replayed {
			r.Replays++
		}
	}
	r.Operations = len(ops)
	keys := map[ExecKey]bool{}
	for k := range execs {
		keys[k] = true
	}
	for k := range r.attempts {
		keys[k] = true
	}
	for k := range records {
		keys[k] = true
	}
	r.Keys = len(keys)
	byID := map[int64]Exec{}
	for _, es := range execs {
		for _, e := range es {
			byID[e.ID] = e
		}
	}
	for _, k := range sortedKeys(keys) {
		r.checkKey(k, byID)
	}
	return r
}

func (r *Report) violate(k ExecKey, format string, args ...any) {
	r.Violations = append(r.Violations, Violation{Key: k, What: fmt.Sprintf(format, args...)})
}

func (r *Report) checkKey(k ExecKey, byID map[int64]Exec) {
	var acted []Exec
	for _, e := range r.execs[k] {
		if !e.Effect {
			r.NoEffect++
			continue
		}
		acted = append(acted, e)
		if !bytes.Equal(e.Body, BodyFor(k)) {
			r.violate(k, "the upstream ran exec %d with a body that is not the key's: %s", e.ID, e.Body)
		}
	}
	r.Executions += len(acted)
	if len(acted) > 1 {
		r.Duplicates++
		r.violate(k, "duplicate: the upstream acted %d times (execs %s)", len(acted), execIDs(acted))
	}
	var first *Exec // the execution whose answer every replay must be
	if len(acted) > 0 {
		first = &acted[0]
	}

	rec, known := r.records[k]
	switch {
	case !known:
		r.violate(k, "no record was read for the key")
	case rec == nil:
		r.Released++
		if first != nil {
			r.violate(k, "released after the upstream acted (exec %d, %s): a retry would run it again", first.ID, first.Fault)
		}
	case rec.State == idemstore.StatePending:
		r.Pending++
		r.violate(k, "still pending after recovery (lease until %s, read at %s)", rec.LeaseUntil.Format(time.RFC3339Nano), rec.ReadAt.Format(time.RFC3339Nano))
	case rec.State == idemstore.StateCompleted:
		r.Completed++
		switch {
		case first == nil:
			r.violate(k, "completed, but the upstream never acted on the key")
		case !first.Delivered:
			r.violate(k, "completed, but exec %d (%s) never delivered its answer", first.ID, first.Fault)
		case rec.Response == nil || rec.Response.Status != first.Status || !bytes.Equal(rec.Response.Body, first.Answer):
			r.violate(k, "completed with an answer that is not exec %d's: %s", first.ID, describeResponse(rec.Response))
		}
	case rec.State == idemstore.StateNeedsReview:
		r.Reviews++
	default:
		r.violate(k, "record in unknown state %q", rec.State)
	}

	for _, a := range r.attempts[k] {
		switch {
		case a.Replayed:
			if first == nil || a.Status != first.Status || !bytes.Equal(a.Body, first.Answer) || a.Exec != first.ID {
				r.violate(k, "a replay differs from the upstream's answer: %s", a.String())
			} else if !first.Delivered {
				r.violate(k, "a replay of exec %d, which never delivered its answer: %s", first.ID, a.String())
			}
		case a.Exec != 0:
			e, ok := byID[a.Exec]
			switch {
			case !ok || e.Key != k:
				r.violate(k, "an answer names exec %d, which is not one of the key's: %s", a.Exec, a.String())
			case a.Status != e.Status || !bytes.Equal(a.Body, e.Answer):
				r.violate(k, "an answer differs from exec %d's: %s", a.Exec, a.String())
			}
		case a.Status >= 200 && a.Status < 300:
			r.violate(k, "a %d answer that no upstream execution gave: %s", a.Status, a.String())
		}
		if a.Verify {
			r.checkVerify(k, rec, a)
		}
	}
}

// checkVerify checks an attempt sent after recovery against the key's
// final record: a completed key is replayed, one that needs review says
// so.
func (r *Report) checkVerify(k ExecKey, rec *idemstore.Record, a Attempt) {
	if rec == nil {
		return
	}
	switch rec.State {
	case idemstore.StateCompleted:
		if !a.Replayed {
			r.violate(k, "after recovery, a completed key was not replayed: %s", a.String())
		}
	case idemstore.StateNeedsReview:
		if a.Status != http.StatusConflict || a.Problem != idem.ProblemNeedsReview {
			r.violate(k, "after recovery, a key that needs review answered otherwise: %s", a.String())
		}
	}
}

// Summary is one line of counts.
func (r *Report) Summary() string {
	return fmt.Sprintf("%d requests (%d operations, %d keys), %d executions (+%d answered 429/503), %d replays, %d reviews, %d completed, %d released, %d pending, duplicates=%d, violations=%d",
		r.Requests, r.Operations, r.Keys, r.Executions, r.NoEffect, r.Replays, r.Reviews, r.Completed, r.Released, r.Pending, r.Duplicates, len(r.Violations))
}

// StatusLine counts the answers by status.
func (r *Report) StatusLine() string {
	var b strings.Builder
	for _, s := range slices.Sorted(maps.Keys(r.Statuses)) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		if s == 0 {
			fmt.Fprintf(&b, "error=%d", r.Statuses[s])
		} else {
			fmt.Fprintf(&b, "%d=%d", s, r.Statuses[s])
		}
	}
	return b.String()
}

// History tells everything known about k: the attempts, the upstream's
// executions and the final record.
func (r *Report) History(k ExecKey) string {
	var b strings.Builder
	sk := StoreKey(k)
	fmt.Fprintf(&b, "key %q scope %q (auth %q) operation %q\n", k.Key, sk.Scope, k.Auth, sk.Operation)
	fmt.Fprintf(&b, "  attempts:\n")
	for _, a := range r.attempts[k] {
		fmt.Fprintf(&b, "    %s\n", a.String())
	}
	fmt.Fprintf(&b, "  executions:\n")
	for _, e := range r.execs[k] {
		fmt.Fprintf(&b, "    exec %d %s effect=%v status=%d delivered=%v %s..%s body=%s\n", e.ID, e.Fault, e.Effect, e.Status, e.Delivered,
			e.Start.Format("15:04:05.000"), e.End.Format("15:04:05.000"), e.Body)
	}
	rec := r.records[k]
	if rec == nil {
		fmt.Fprintf(&b, "  record: absent\n")
	} else {
		fmt.Fprintf(&b, "  record: %s token=%s lease_until=%s created=%s updated=%s read=%s reason=%q response=%s\n",
			rec.State, rec.Token, rec.LeaseUntil.Format("15:04:05.000"), rec.CreatedAt.Format("15:04:05.000"),
			rec.UpdatedAt.Format("15:04:05.000"), rec.ReadAt.Format("15:04:05.000"), rec.Reason, describeResponse(rec.Response))
	}
	return b.String()
}

func describeResponse(resp *idemstore.Response) string {
	if resp == nil {
		return "none"
	}
	body := resp.Body
	if len(body) > 80 {
		body = append(body[:80:80], "…"...)
	}
	s := fmt.Sprintf("%d %q", resp.Status, body)
	if resp.NotReplayable != "" {
		s += " not replayable: " + resp.NotReplayable
	}
	return s
}

func execIDs(es []Exec) string {
	ids := make([]string, len(es))
	for i, e := range es {
		ids[i] = fmt.Sprintf("%d (%s)", e.ID, e.Fault)
	}
	return strings.Join(ids, ", ")
}

func sortedKeys(m map[ExecKey]bool) []ExecKey {
	keys := slices.Collect(maps.Keys(m))
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.Auth != b.Auth {
			return a.Auth < b.Auth
		}
		if a.Path != b.Path {
			return a.Path < b.Path
		}
		return a.Key < b.Key
	})
	return keys
}

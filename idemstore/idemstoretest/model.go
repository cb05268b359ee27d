package idemstoretest

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idem-dev/idem/idemstore"
)

// This file is the sequential specification of one record that the
// Linearizable area checks recorded histories against: the record's state
// machine as the store contract describes it.
//
//	absent        --Reserve-->                   pending(token, fingerprint)
//	pending(tok)  --Complete(tok)-->             completed(tok, response)
//	pending(tok)  --Release(tok)-->              absent
//	pending(tok)  --Escalate(tok)-->             needs_review(reason)
//	pending(tok)  --Extend(tok)-->               pending(tok), lease renewed
//	pending(tok)  --Takeover(tok, new)-->        pending(new)      if the lease expired
//	needs_review(tok) --Resolve(tok or none)-->  completed(tok) | absent
//	completed(tok) --Delete(tok or none)-->      absent
//
// Release and Escalate with IfExpired apply only to an expired lease; a
// record in review keeps the token it was escalated under, and a Resolve
// that names a token settles only that attempt; a completed record keeps
// the token it was completed under, and a Delete that names a token
// deletes only that answer. Every
// other call changes nothing and says why (ErrLeaseLost, ErrNotFound,
// ErrNotNeedsReview, ErrNotCompleted); Reserve of an existing record and Get
// return what the record is.
//
// A Reserve that failed may have inserted its record, and its caller must
// release the token; a store may also release it itself, on the caller's
// behalf (a SQL store does for a batched Reserve whose caller left while
// the batch ran). So a record that such a Reserve left pending, and that
// no call has settled or taken over since, may vanish before any later
// call: the model marks it unclaimed.
//
// Whether a lease has expired is the store's clock's business, which a test
// cannot drive on a real server. The model keeps it deterministic instead:
// every lease the workload grants (Reserve, Extend, Takeover) is either an
// hour in the past, expired the moment it is granted, or an hour ahead,
// alive until long after the test. So the lease's state is a plain bit of
// the record's state, set by the last call that granted a lease, and the
// model knows exactly which Takeover and IfExpired calls may apply. (A model
// in which expiry may happen at any moment would accept a store that expires
// leases early, and would check less.)

// opKind names a store call.
type opKind uint8

const (
	opReserve opKind = iota + 1
	opGet
	opComplete
	opRelease
	opEscalate
	opExtend
	opTakeover
	opResolve
	opDelete
)

var opNames = [...]string{
	opReserve: "Reserve", opGet: "Get", opComplete: "Complete", opRelease: "Release",
	opEscalate: "Escalate", opExtend: "Extend", opTakeover: "Takeover", opResolve: "Resolve",
	opDelete: "Delete",
}

func (k opKind) String() string { return opNames[k] }

// linInput is one call as the model sees it. The fields a call does not use
// are zero.
type linInput struct {
	key         string // the record's Key.Key: histories are checked per key
	kind        opKind
	token       string        // Reserve: the new token; Takeover: the old one; other fenced calls: the lease's; Resolve and Delete: the attempt's, or none
	newToken    string        // Takeover
	fingerprint string        // Reserve
	lease       time.Duration // Reserve, Extend, Takeover
	ifExpired   bool          // Release, Escalate
	reason      string        // Escalate; Resolve (empty keeps the escalation's)
	response    string        // Complete, Resolve: the response's status and body
	release     bool          // Resolve: release instead of complete
}

// result is how a call ended.
type result uint8

const (
	resOK             result = iota + 1 // the change applied, or Get found the record
	resCreated                          // Reserve inserted the record
	resExists                           // Reserve found a record
	resLeaseLost                        // idemstore.ErrLeaseLost
	resNotFound                         // idemstore.ErrNotFound
	resNotNeedsReview                   // idemstore.ErrNotNeedsReview
	resNotCompleted                     // idemstore.ErrNotCompleted
)

var resultNames = [...]string{
	resOK: "ok", resCreated: "created", resExists: "exists", resLeaseLost: "ErrLeaseLost",
	resNotFound: "ErrNotFound", resNotNeedsReview: "ErrNotNeedsReview", resNotCompleted: "ErrNotCompleted",
}

// linOutput is what a call returned.
type linOutput struct {
	// unknown means the call failed (ErrUnavailable, a cancelled context):
	// it may or may not have taken effect, at any moment after it was made.
	unknown bool
	result  result
	// record is what Get found (result ok) or Reserve returned (result
	// exists); zero otherwise.
	record recordState
}

// recordState is the model's state of one record, and what a read of a
// record shows, in the same terms: the token (Resolve is fenced by the
// token the record was escalated under, Delete by the one it was completed
// under), the lease only while it is pending (the contract says nothing of
// it afterwards), and the response once it is completed.
type recordState struct {
	state       idemstore.State // "" while there is no record
	token       string
	fingerprint string
	expired     bool // the lease has expired by the store's clock
	reason      string
	response    string
	// unclaimed: pending under the token of a Reserve whose outcome is
	// unknown (see above). A read does not show it.
	unclaimed bool
}

// shown is s as a read returns it.
func (s recordState) shown() recordState {
	s.unclaimed = false
	return s
}

// observe turns a record a store returned into the model's terms.
func observe(rec *idemstore.Record) recordState {
	s := recordState{state: rec.State, fingerprint: rec.Fingerprint, reason: rec.Reason}
	switch rec.State {
	case idemstore.StatePending:
		s.token, s.expired = rec.Token, rec.LeaseExpired()
	case idemstore.StateNeedsReview:
		s.token = rec.Token
	case idemstore.StateCompleted:
		s.token, s.response = rec.Token, responseString(rec.Response)
	}
	return s
}

// responseString is how the model keeps a response: its status and body.
func responseString(r *idemstore.Response) string {
	if r == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%d %s", r.Status, r.Body)
}

// apply runs in on s: what the call must return, and the record after it.
func apply(s recordState, in linInput) (linOutput, recordState) {
	fenced := s.state == idemstore.StatePending && s.token == in.token
	lost := linOutput{result: resLeaseLost}
	ok := linOutput{result: resOK}
	switch in.kind {
	case opReserve:
		if s.state != "" {
			return linOutput{result: resExists, record: s.shown()}, s
		}
		return linOutput{result: resCreated}, recordState{
			state: idemstore.StatePending, token: in.token, fingerprint: in.fingerprint, expired: in.lease <= 0,
		}
	case opGet:
		if s.state == "" {
			return linOutput{result: resNotFound}, s
		}
		return linOutput{result: resOK, record: s.shown()}, s
	case opComplete:
		if !fenced {
			return lost, s
		}
		return ok, recordState{state: idemstore.StateCompleted, token: s.token, fingerprint: s.fingerprint, response: in.response}
	case opRelease:
		if !fenced || in.ifExpired && !s.expired {
			return lost, s
		}
		return ok, recordState{}
	case opEscalate:
		if !fenced || in.ifExpired && !s.expired {
			return lost, s
		}
		return ok, recordState{state: idemstore.StateNeedsReview, token: s.token, fingerprint: s.fingerprint, reason: in.reason}
	case opExtend:
		if !fenced {
			return lost, s
		}
		s.expired = in.lease <= 0
		return ok, s
	case opTakeover:
		if !fenced || !s.expired {
			return lost, s
		}
		s.token, s.expired, s.unclaimed = in.newToken, in.lease <= 0, false
		return ok, s
	case opResolve:
		switch {
		case s.state == "":
			return linOutput{result: resNotFound}, s
		case s.state != idemstore.StateNeedsReview:
			return linOutput{result: resNotNeedsReview}, s
		case in.token != "" && in.token != s.token:
			return lost, s
		case in.release:
			return ok, recordState{}
		}
		reason := cmp.Or(in.reason, s.reason)
		return ok, recordState{state: idemstore.StateCompleted, token: s.token, fingerprint: s.fingerprint, reason: reason, response: in.response}
	case opDelete:
		switch s.state {
		case "":
			return linOutput{result: resNotFound}, s
		case idemstore.StateCompleted:
			if in.token != "" && in.token != s.token {
				return lost, s
			}
			return ok, recordState{}
		}
		return linOutput{result: resNotCompleted}, s
	}
	panic(fmt.Sprintf("idemstoretest: unknown call %d", in.kind))
}

// step is the model's step: the states a record in s can be in after a call
// in that returned out. A call whose outcome is unknown took effect or did
// not; any other call must have returned what apply says. An unclaimed
// record may have been released before the call.
func step(s recordState, in linInput, out linOutput) []any {
	from := []recordState{s}
	if s.unclaimed {
		from = append(from, recordState{})
	}
	var states []any
	for _, s := range from {
		want, next := apply(s, in)
		switch {
		case out.unknown:
			if in.kind == opReserve && want.result == resCreated {
				next.unclaimed = true
			}
			states = append(states, s, next)
		case out == want:
			states = append(states, next)
		}
	}
	return states
}

var modelSeed = maphash.MakeSeed()

// recordModel is the porcupine model of one record, checked key by key.
func recordModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partitionByKey,
		Init:      func() []any { return []any{recordState{}} },
		Step: func(state, input, output any) []any {
			return step(state.(recordState), input.(linInput), output.(linOutput))
		},
		Hash: func(state any) uint64 { return maphash.Comparable(modelSeed, state.(recordState)) },
		DescribeOperation: func(input, output any) string {
			return describeCall(input.(linInput), output.(linOutput))
		},
		DescribeState: func(state any) string { return state.(recordState).String() },
	}
	return nm.ToModel()
}

// partitionByKey splits a history into one history per record, in the
// order of the keys.
func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := make(map[string][]porcupine.Operation)
	for _, op := range history {
		k := op.Input.(linInput).key
		byKey[k] = append(byKey[k], op)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([][]porcupine.Operation, len(keys))
	for i, k := range keys {
		parts[i] = byKey[k]
	}
	return parts
}

func (s recordState) String() string {
	switch s.state {
	case "":
		return "absent"
	case idemstore.StatePending:
		lease := "live"
		if s.expired {
			lease = "expired"
		}
		return fmt.Sprintf("pending(%s, %s, lease %s)", s.token, s.fingerprint, lease)
	case idemstore.StateNeedsReview:
		return fmt.Sprintf("needs_review(%s, %s, %q)", s.token, s.fingerprint, s.reason)
	case idemstore.StateCompleted:
		if s.reason != "" {
			return fmt.Sprintf("completed(%s, %q, reason %q)", s.fingerprint, s.response, s.reason)
		}
		return fmt.Sprintf("completed(%s, %q)", s.fingerprint, s.response)
	}
	return fmt.Sprintf("%s(%s, %s, %q)", s.state, s.token, s.fingerprint, s.reason)
}

func (in linInput) String() string {
	var args []string
	add := func(format string, a ...any) { args = append(args, fmt.Sprintf(format, a...)) }
	switch in.kind {
	case opReserve:
		add("%s, %s, lease %v", in.token, in.fingerprint, in.lease)
	case opComplete:
		add("%s, %q", in.token, in.response)
	case opRelease, opEscalate:
		add("%s", in.token)
		if in.kind == opEscalate {
			add("%q", in.reason)
		}
		if in.ifExpired {
			add("IfExpired")
		}
	case opExtend:
		add("%s, lease %v", in.token, in.lease)
	case opTakeover:
		add("%s → %s, lease %v", in.token, in.newToken, in.lease)
	case opResolve:
		if in.token != "" {
			add("%s", in.token)
		}
		if in.release {
			add("release")
		} else {
			add("complete %q", in.response)
		}
		if in.reason != "" {
			add("reason %q", in.reason)
		}
	}
	return fmt.Sprintf("%s(%s)", in.kind, strings.Join(args, ", "))
}

func (out linOutput) String() string {
	switch {
	case out.unknown:
		return "unknown (failed: may have taken effect)"
	case out.result == resExists || out.result == resOK && out.record.state != "":
		return resultNames[out.result] + " " + out.record.String()
	}
	return resultNames[out.result]
}

func describeCall(in linInput, out linOutput) string { return in.String() + " → " + out.String() }

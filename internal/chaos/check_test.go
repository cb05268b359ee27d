package chaos_test

import (
	"strings"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/chaos"
)

// TestCheck feeds Check one history per invariant, broken or kept, and
// checks what it reports.
func TestCheck(t *testing.T) {
	key := chaos.ExecKey{Auth: "Bearer a", Path: "/payments", Key: "k1"}
	exec := func(id int64, f chaos.Fault, answer string) chaos.Exec {
		return chaos.Exec{ID: id, Key: key, Body: chaos.BodyFor(key), Fault: f, Effect: f != chaos.Fault503 && f != chaos.Fault429,
			Status: 201, Answer: []byte(answer), Delivered: f == chaos.FaultNone}
	}
	completed := &idemstore.Record{Key: chaos.StoreKey(key), State: idemstore.StateCompleted, Response: &idemstore.Response{Status: 201, Body: []byte("A1")}}
	review := &idemstore.Record{Key: chaos.StoreKey(key), State: idemstore.StateNeedsReview}
	answer := chaos.Attempt{Key: key, Status: 201, Body: []byte("A1"), Exec: 1}
	replay := chaos.Attempt{Key: key, Status: 201, Body: []byte("A1"), Exec: 1, Replayed: true}
	for _, tc := range []struct {
		name     string
		execs    []chaos.Exec
		attempts []chaos.Attempt
		record   *idemstore.Record
		want     string // a violation starting so; "" for none
	}{
		{"completed and replayed", []chaos.Exec{exec(1, chaos.FaultNone, "A1")}, []chaos.Attempt{answer, replay}, completed, ""},
		{"released before acting", []chaos.Exec{exec(1, chaos.Fault503, "A1")}, nil, nil, ""},
		{"review after a reset", []chaos.Exec{exec(1, chaos.FaultReset, "A1")}, nil, review, ""},
		{"duplicate", []chaos.Exec{exec(1, chaos.FaultNone, "A1"), exec(2, chaos.FaultNone, "A2")}, []chaos.Attempt{answer}, completed, "duplicate:"},
		{"another body ran", []chaos.Exec{func() chaos.Exec { e := exec(1, chaos.FaultNone, "A1"); e.Body = chaos.ProbeBody(key); return e }()}, nil, completed, "the upstream ran exec 1 with a body"},
		{"released after acting", []chaos.Exec{exec(1, chaos.FaultReset, "A1")}, nil, nil, "released after the upstream acted"},
		{"pending", []chaos.Exec{exec(1, chaos.FaultHang, "A1")}, nil, &idemstore.Record{State: idemstore.StatePending}, "still pending"},
		{"completed without acting", nil, []chaos.Attempt{replay}, completed, "completed, but the upstream never acted"},
		{"completed with an undelivered answer", []chaos.Exec{exec(1, chaos.FaultTruncate, "A1")}, nil, completed, "completed, but exec 1 (truncate) never delivered"},
		{"completed with another answer", []chaos.Exec{exec(1, chaos.FaultNone, "A2")}, nil, completed, "completed with an answer that is not exec 1's"},
		{"replay differs", []chaos.Exec{exec(1, chaos.FaultNone, "A1")}, []chaos.Attempt{{Key: key, Status: 201, Body: []byte("A1 "), Replayed: true}}, completed, "a replay differs"},
		{"replay names another exec", []chaos.Exec{exec(1, chaos.FaultNone, "A1")}, []chaos.Attempt{{Key: key, Status: 201, Body: []byte("A1"), Exec: 2, Replayed: true}}, completed, "a replay differs"},
		{"replay of a proxy's problem", []chaos.Exec{exec(1, chaos.FaultReset, "A1")}, []chaos.Attempt{{Key: key, Status: 502, Body: []byte(`{"type":"x"}`), Replayed: true}}, review, "a replay differs"},
		{"answer from another exec", []chaos.Exec{exec(1, chaos.FaultNone, "A1")}, []chaos.Attempt{{Key: key, Status: 201, Body: []byte("A1"), Exec: 7}}, completed, "an answer names exec 7"},
		{"2xx from nowhere", []chaos.Exec{exec(1, chaos.FaultNone, "A1")}, []chaos.Attempt{{Key: key, Status: 200, Body: []byte("{}")}}, completed, "a 200 answer that no upstream execution gave"},
		{"completed but not replayed after recovery", []chaos.Exec{exec(1, chaos.FaultNone, "A1")}, []chaos.Attempt{{Key: key, Status: 409, Problem: idem.ProblemInFlight, Verify: true}}, completed, "after recovery, a completed key was not replayed"},
		{"review answered otherwise after recovery", []chaos.Exec{exec(1, chaos.FaultReset, "A1")}, []chaos.Attempt{{Key: key, Status: 503, Verify: true}}, review, "after recovery, a key that needs review"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := chaos.Check(map[chaos.ExecKey][]chaos.Exec{key: tc.execs}, tc.attempts, map[chaos.ExecKey]*idemstore.Record{key: tc.record})
			if tc.want == "" {
				if len(rep.Violations) > 0 {
					t.Fatalf("violations %v, want none", rep.Violations)
				}
				return
			}
			for _, v := range rep.Violations {
				if strings.HasPrefix(v.What, tc.want) {
					if !strings.Contains(rep.History(key), `key "k1"`) {
						t.Errorf("History does not name the key:\n%s", rep.History(key))
					}
					return
				}
			}
			t.Fatalf("violations %v, want one starting %q", rep.Violations, tc.want)
		})
	}
}

// TestCheckCounts checks the counts of a report.
func TestCheckCounts(t *testing.T) {
	a := chaos.ExecKey{Path: "/payments", Key: "a"}
	b := chaos.ExecKey{Path: "/payments", Key: "b"}
	c := chaos.ExecKey{Path: "/payments", Key: "c"}
	execs := map[chaos.ExecKey][]chaos.Exec{
		a: {{ID: 1, Key: a, Body: chaos.BodyFor(a), Fault: chaos.Fault503, Status: 503},
			{ID: 2, Key: a, Body: chaos.BodyFor(a), Fault: chaos.FaultNone, Effect: true, Status: 201, Answer: []byte("x"), Delivered: true}},
		b: {{ID: 3, Key: b, Body: chaos.BodyFor(b), Fault: chaos.FaultReset, Effect: true, Status: 201, Answer: []byte("y")}},
	}
	attempts := []chaos.Attempt{
		{Op: 1, Key: a, Status: 503, Exec: 1},
		{Op: 1, Key: a, Status: 201, Body: []byte("x"), Exec: 2},
		{Op: 2, Key: a, Status: 201, Body: []byte("x"), Exec: 2, Replayed: true},
		{Op: 3, Key: b, Err: "EOF"},
		{Op: 4, Key: c, Status: 503},
	}
	records := map[chaos.ExecKey]*idemstore.Record{
		a: {State: idemstore.StateCompleted, Response: &idemstore.Response{Status: 201, Body: []byte("x")}},
		b: {State: idemstore.StateNeedsReview},
		c: nil,
	}
	rep := chaos.Check(execs, attempts, records)
	if len(rep.Violations) != 0 {
		t.Fatalf("violations: %v", rep.Violations)
	}
	got := []int{rep.Requests, rep.Operations, rep.Keys, rep.Executions, rep.NoEffect, rep.Replays, rep.Completed, rep.Reviews, rep.Released, rep.Duplicates}
	want := []int{5, 4, 3, 2, 1, 1, 1, 1, 1, 0}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("counts %v, want %v (requests, operations, keys, executions, no effect, replays, completed, reviews, released, duplicates)", got, want)
		}
	}
	if s := rep.StatusLine(); s != "error=1 201=2 503=2" {
		t.Errorf("StatusLine = %q", s)
	}
}

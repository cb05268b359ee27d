package rpccore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// answeringStore is a memory store whose Reserve answers reserve when set:
// a record already there, or an error.
type answeringStore struct {
	*idemmem.Store
	reserve func(context.Context, idemstore.ReserveParams) (*idemstore.Record, bool, error)
	rec     *idemstore.Record // the last record reserve answered
}

func (s *answeringStore) Reserve(ctx context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
	if s.reserve == nil {
		return s.Store.Reserve(ctx, p)
	}
	r, created, err := s.reserve(ctx, p)
	if r != nil {
		s.rec = r
	}
	return r, created, err
}

func (s *answeringStore) Get(ctx context.Context, k idemstore.Key) (*idemstore.Record, error) {
	if s.rec != nil {
		c := *s.rec
		return &c, nil
	}
	return s.Store.Get(ctx, k)
}

const pathsKey = "0190a0e0-0000-7000-8000-000000000001"

// TestServeRarePaths drives every way serve answers other than running
// the handler under a new lease, and checks the code, the reason, whether
// the handler ran, and the event OnOutcome got: the refusals each have a
// method of their own, which the front doors' tests do not all reach.
func TestServeRarePaths(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	existing := func(fp string, st idemstore.State) func(context.Context, idemstore.ReserveParams) (*idemstore.Record, bool, error) {
		return func(_ context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
			f := fp
			if f == "" {
				f = p.Fingerprint
			}
			return &idemstore.Record{Key: p.Key, Fingerprint: f, State: st, Token: "tok", CreatedAt: t0,
				ReadAt: t0.Add(5 * time.Second), LeaseUntil: t0.Add(25 * time.Second), Reason: "r"}, false, nil
		}
	}
	failing := func(err error) func(context.Context, idemstore.ReserveParams) (*idemstore.Record, bool, error) {
		return func(ctx context.Context, _ idemstore.ReserveParams) (*idemstore.Record, bool, error) {
			if ctx.Err() != nil {
				return nil, false, ctx.Err()
			}
			return nil, false, err
		}
	}
	down := fmt.Errorf("down: %w", idemstore.ErrUnavailable)
	cases := []struct {
		name     string
		scope    string
		account  string // the request's account, when not "acc"
		noKey    bool
		failOpen bool
		cancel   bool
		reserve  func(context.Context, idemstore.ReserveParams) (*idemstore.Record, bool, error)

		code    code.Code
		reason  string // ErrorInfo's, "" for none
		ran     bool
		outcome string
	}{
		{name: "fingerprint fails", account: "\xff", code: code.Code_INTERNAL},
		{name: "cancelled", cancel: true, reserve: failing(down), code: code.Code_CANCELLED, outcome: idem.SituationCanceled.Name},
		{name: "scope too long", scope: strings.Repeat("s", idem.MaxScopeLength+1), code: code.Code_INVALID_ARGUMENT, reason: ReasonTooLong, outcome: idem.SituationTooLong.Name},
		{name: "blank scope", scope: "   ", code: code.Code_UNAUTHENTICATED, reason: ReasonScopeMissing, outcome: idem.SituationScopeMissing.Name},
		{name: "sealed", reserve: failing(fmt.Errorf("x: %w", idem.ErrSealed)), code: code.Code_INTERNAL, reason: ReasonAnswerSealed, outcome: idem.SituationSealed.Name},
		{name: "store down", reserve: failing(down), code: code.Code_UNAVAILABLE, reason: ReasonStoreUnavailable, outcome: idem.SituationUnavailable.Name},
		{name: "store down, fail open", failOpen: true, reserve: failing(down), code: code.Code_OK, ran: true, outcome: idem.SituationFailOpen.Name},
		{name: "in flight", reserve: existing("", idemstore.StatePending), code: code.Code_ABORTED, reason: ReasonInFlight, outcome: idem.SituationInFlight.Name},
		{name: "mismatch", reserve: existing("other", idemstore.StatePending), code: code.Code_FAILED_PRECONDITION, reason: ReasonKeyReused, outcome: idem.SituationMismatch.Name},
		{name: "needs review", reserve: existing("", idemstore.StateNeedsReview), code: code.Code_FAILED_PRECONDITION, reason: ReasonNeedsReview, outcome: idem.SituationNeedsReview.Name},
		{name: "no key", noKey: true, code: code.Code_OK, ran: true, outcome: idem.SituationNoKey.Name},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := &answeringStore{Store: idemmem.MustNew(idemmem.Config{}), reserve: tc.reserve}
			e, err := idem.NewEngine(store, idem.EngineConfig{})
			if err != nil {
				t.Fatal(err)
			}
			scope := tc.scope
			if scope == "" {
				scope = "tenant"
			}
			var events []Event
			s, err := New(e, Options{
				Scope:     func(context.Context) (string, error) { return scope, nil },
				StatusOf:  func(error) (*spb.Status, bool) { return nil, false },
				FailOpen:  tc.failOpen,
				OnOutcome: func(ev Event) { events = append(events, ev) },
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				cancel()
			}
			req := &testpb.ChargeRequest{Account: "acc", Amount: 5, RequestId: pathsKey}
			if tc.account != "" {
				req.Account = tc.account
			}
			if tc.noKey {
				req.RequestId = ""
			}
			ran := false
			ans := s.Serve(ctx, &Call{Method: pathsMethod, Request: req}, func(context.Context) Result {
				ran = true
				return Result{Msg: &testpb.Payment{}}
			})
			s.Wait()
			got := code.Code_OK
			if ans.Status != nil {
				got = code.Code(ans.Status.Code)
			}
			if got != tc.code || ran != tc.ran {
				t.Fatalf("code %v, handler ran %v; want %v, %v (answer %+v)", got, ran, tc.code, tc.ran, ans)
			}
			if r := errorInfoReason(t, ans.Status); r != tc.reason {
				t.Errorf("ErrorInfo reason %q, want %q", r, tc.reason)
			}
			if len(events) != 1 || events[0].Outcome != tc.outcome || events[0].Code != tc.code {
				t.Fatalf("events %+v, want one with outcome %q and code %v", events, tc.outcome, tc.code)
			}
			if wantKey := pathsKey; tc.noKey && events[0].Key != "" || !tc.noKey && events[0].Key != wantKey {
				t.Errorf("event key %q", events[0].Key)
			}
		})
	}
}

// TestServeWaitEndsBeforeDeadline: a duplicate of a call in flight waits
// at most nine tenths of the time left before its deadline, not its
// policy's whole Wait, and is then told the call is in flight.
func TestServeWaitEndsBeforeDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &answeringStore{Store: idemmem.MustNew(idemmem.Config{}),
			reserve: func(_ context.Context, p idemstore.ReserveParams) (*idemstore.Record, bool, error) {
				now := time.Now()
				return &idemstore.Record{Key: p.Key, Fingerprint: p.Fingerprint, State: idemstore.StatePending, Token: "tok",
					CreatedAt: now, ReadAt: now, LeaseUntil: now.Add(time.Minute)}, false, nil
			}}
		e, err := idem.NewEngine(store, idem.EngineConfig{PollInterval: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(e, Options{
			Scope:    func(context.Context) (string, error) { return "tenant", nil },
			StatusOf: func(error) (*spb.Status, bool) { return nil, false },
			Policy:   Policy{Wait: time.Minute},
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		ans := s.Serve(ctx, &Call{Method: pathsMethod, Request: &testpb.ChargeRequest{Account: "acc", Amount: 5, RequestId: pathsKey}},
			func(context.Context) Result { t.Error("the handler ran"); return Result{} })
		waited := time.Since(start)
		if ans.Status == nil || code.Code(ans.Status.Code) != code.Code_ABORTED {
			t.Fatalf("answer %+v, want ABORTED (in flight)", ans)
		}
		if waited < 80*time.Millisecond || waited > 91*time.Millisecond {
			t.Fatalf("waited %v, want about 90ms (nine tenths of the 100ms left)", waited)
		}
	})
}

const pathsMethod = "/idem.test.v1.Payments/Charge"

// errorInfoReason is the reason of st's ErrorInfo, or "".
func errorInfoReason(t *testing.T, st *spb.Status) string {
	t.Helper()
	if st == nil {
		return ""
	}
	for _, d := range st.Details {
		var info errdetails.ErrorInfo
		if d.MessageIs(&info) {
			if err := d.UnmarshalTo(&info); err != nil {
				t.Fatal(err)
			}
			return info.Reason
		}
	}
	return ""
}

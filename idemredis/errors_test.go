package idemredis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-dev/idem/idemstore"
)

// errorCase is one input of interpretError and what the result must and
// must not wrap.
type errorCase struct {
	name string
	ctx  context.Context
	err  error
	want []error // every error the result must wrap
	not  []error // errors it must not wrap
}

// unclassified are the sentinels an error that is not the store's fault
// or the network's must not wrap.
var unclassified = []error{idemstore.ErrUnavailable, idemstore.ErrNotFound, idemstore.ErrRetryable, idemstore.ErrLeaseLost}

func TestInterpretError(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	bg := context.Background()
	checkErrors(t, []errorCase{
		{"nil", bg, nil, nil, nil},
		{"redis nil", bg, rueidis.Nil, []error{idemstore.ErrNotFound}, []error{idemstore.ErrUnavailable}},
		{"client closed", bg, rueidis.ErrClosing, []error{idemstore.ErrUnavailable, rueidis.ErrClosing}, nil},
		{"no node for the slot", bg, rueidis.ErrNoSlot, []error{idemstore.ErrUnavailable}, nil},
		{"connection refused", bg, refused, []error{idemstore.ErrUnavailable, syscall.ECONNREFUSED}, nil},
		{"connection reset", bg, fmt.Errorf("read: %w", syscall.ECONNRESET), []error{idemstore.ErrUnavailable}, nil},
		{"eof", bg, io.EOF, []error{idemstore.ErrUnavailable}, nil},
		{"network timeout", bg, timeout, []error{idemstore.ErrUnavailable}, []error{context.DeadlineExceeded}},
		{"canceled", bg, context.Canceled, []error{context.Canceled}, []error{idemstore.ErrUnavailable}},
		{"deadline", bg, fmt.Errorf("dial: %w", context.DeadlineExceeded), []error{context.DeadlineExceeded}, []error{idemstore.ErrUnavailable}},
		{"timeout after cancel", cancelled, timeout, []error{context.Canceled}, []error{idemstore.ErrUnavailable}},
		{"timeout at the deadline", pastDeadline{bg}, timeout, []error{context.DeadlineExceeded}, []error{idemstore.ErrUnavailable}},
		{"other", bg, errors.New("something else"), nil, unclassified},
	})
}

// TestInterpretServerError classifies error replies as a real server sends
// them: the Redis states are raised by a script (redis.error_reply), the
// script error and the nil reply are real.
func TestInterpretServerError(t *testing.T) {
	t.Parallel()
	c := standaloneClient(t)
	ctx := t.Context()
	reply := func(msg string) error {
		t.Helper()
		err := c.Do(ctx, c.B().Eval().Script("return redis.error_reply(ARGV[1])").Numkeys(0).Arg(msg).Build()).Error()
		// rueidis drops a leading "ERR ".
		if re, ok := rueidis.IsRedisErr(err); !ok || re.Error() != strings.TrimPrefix(msg, "ERR ") {
			t.Fatalf("error_reply(%q) came back as %#v", msg, err)
		}
		return err
	}
	unavailable := []error{idemstore.ErrUnavailable}
	cases := []errorCase{
		{"clusterdown", ctx, reply("CLUSTERDOWN The cluster is down"), unavailable, nil},
		{"masterdown", ctx, reply("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), unavailable, nil},
		{"loading", ctx, reply("LOADING Redis is loading the dataset in memory"), unavailable, nil},
		{"readonly", ctx, reply("READONLY You can't write against a read only replica."), unavailable, nil},
		{"oom", ctx, reply("OOM command not allowed when used memory > 'maxmemory'."), unavailable, nil},
		{"max clients", ctx, reply("ERR max number of clients reached"), unavailable, nil},
		{"tryagain", ctx, reply("TRYAGAIN Multiple keys request during rehashing of slot"), []error{idemstore.ErrRetryable}, []error{idemstore.ErrUnavailable}},
	}
	scriptErr := c.Do(ctx, c.B().Eval().Script("return nosuchglobal.x").Numkeys(0).Build()).Error()
	nilErr := c.Do(ctx, c.B().Get().Key(testPrefix()).Build()).Error()
	cases = append(cases,
		errorCase{"script error", ctx, scriptErr, nil, unclassified},
		errorCase{"nil reply", ctx, nilErr, []error{idemstore.ErrNotFound}, []error{idemstore.ErrUnavailable}},
	)
	checkErrors(t, cases)
}

func checkErrors(t *testing.T, cases []errorCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := interpretError(tc.ctx, tc.err)
			if tc.err == nil {
				if got != nil {
					t.Fatalf("interpretError(nil) = %v", got)
				}
				return
			}
			if got == nil {
				t.Fatalf("interpretError(%v) = nil", tc.err)
			}
			for _, w := range tc.want {
				if !errors.Is(got, w) {
					t.Errorf("interpretError(%v) = %v, does not wrap %v", tc.err, got, w)
				}
			}
			for _, n := range tc.not {
				if errors.Is(got, n) {
					t.Errorf("interpretError(%v) = %v, wraps %v", tc.err, got, n)
				}
			}
		})
	}
}

// pastDeadline is a context whose deadline has passed but whose Err is not
// set yet: the moment between a connection deadline taken from ctx firing
// and ctx's own timer.
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

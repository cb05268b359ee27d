package idemredis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
)

func TestInterpretError(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name string
		ctx  context.Context
		err  error
		want []error // every error the result must wrap
		not  []error // errors it must not wrap
	}{
		{"nil", context.Background(), nil, nil, nil},
		{"redis nil", context.Background(), redis.Nil, []error{idemstore.ErrNotFound}, []error{idemstore.ErrUnavailable}},
		{"client closed", context.Background(), redis.ErrClosed, []error{idemstore.ErrUnavailable, redis.ErrClosed}, nil},
		{"pool timeout", context.Background(), redis.ErrPoolTimeout, []error{idemstore.ErrUnavailable}, nil},
		{"connection refused", context.Background(), refused, []error{idemstore.ErrUnavailable, syscall.ECONNREFUSED}, nil},
		{"connection reset", context.Background(), fmt.Errorf("read: %w", syscall.ECONNRESET), []error{idemstore.ErrUnavailable}, nil},
		{"eof", context.Background(), io.EOF, []error{idemstore.ErrUnavailable}, nil},
		{"network timeout", context.Background(), timeout, []error{idemstore.ErrUnavailable}, []error{context.DeadlineExceeded}},
		{"clusterdown", context.Background(), errors.New("CLUSTERDOWN The cluster is down"), []error{idemstore.ErrUnavailable}, nil},
		{"masterdown", context.Background(), errors.New("MASTERDOWN Link with MASTER is down"), []error{idemstore.ErrUnavailable}, nil},
		{"loading", context.Background(), errors.New("LOADING Redis is loading the dataset in memory"), []error{idemstore.ErrUnavailable}, nil},
		{"readonly", context.Background(), errors.New("READONLY You can't write against a read only replica."), []error{idemstore.ErrUnavailable}, nil},
		{"oom", context.Background(), errors.New("OOM command not allowed when used memory > 'maxmemory'."), []error{idemstore.ErrUnavailable}, nil},
		{"tryagain", context.Background(), errors.New("TRYAGAIN Multiple keys request during rehashing of slot"), []error{idemstore.ErrRetryable}, []error{idemstore.ErrUnavailable}},
		{"canceled", context.Background(), context.Canceled, []error{context.Canceled}, []error{idemstore.ErrUnavailable}},
		{"deadline", context.Background(), fmt.Errorf("dial: %w", context.DeadlineExceeded), []error{context.DeadlineExceeded}, []error{idemstore.ErrUnavailable}},
		{"timeout after cancel", cancelled, timeout, []error{context.Canceled}, []error{idemstore.ErrUnavailable}},
		{"timeout at the deadline", pastDeadline{context.Background()}, timeout, []error{context.DeadlineExceeded}, []error{idemstore.ErrUnavailable}},
		{"script error", context.Background(), errors.New("ERR user_script:1: Script attempted to access nonexistent global variable"), nil,
			[]error{idemstore.ErrUnavailable, idemstore.ErrNotFound, idemstore.ErrRetryable, idemstore.ErrLeaseLost}},
	}
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

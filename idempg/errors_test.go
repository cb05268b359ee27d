package idempg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/idem-dev/idem/idemstore"
)

func TestInterpretError(t *testing.T) {
	t.Parallel()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	opErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	cases := []struct {
		name string
		ctx  context.Context
		err  error
		want []error // every one must match with errors.Is
		not  []error // none may match
	}{
		{"serialization failure", context.Background(), &pgconn.PgError{Code: "40001"}, []error{idemstore.ErrRetryable}, []error{idemstore.ErrUnavailable}},
		{"deadlock", context.Background(), fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "40P01"}), []error{idemstore.ErrRetryable}, nil},
		{"unique violation is not retryable", context.Background(), &pgconn.PgError{Code: "23505"}, nil, []error{idemstore.ErrRetryable, idemstore.ErrUnavailable}},
		{"admin shutdown", context.Background(), &pgconn.PgError{Code: "57P01"}, []error{idemstore.ErrUnavailable}, nil},
		{"connection exception", context.Background(), &pgconn.PgError{Code: "08006"}, []error{idemstore.ErrUnavailable}, nil},
		{"too many connections", context.Background(), &pgconn.PgError{Code: "53300"}, []error{idemstore.ErrUnavailable}, nil},
		{"net error", context.Background(), opErr, []error{idemstore.ErrUnavailable}, nil},
		{"closed pool", context.Background(), puddle.ErrClosedPool, []error{idemstore.ErrUnavailable}, nil},
		{"closed conn", context.Background(), fmt.Errorf("x: %w", pgconn.ErrConnClosed), []error{idemstore.ErrUnavailable}, nil},
		{"unexpected EOF", context.Background(), io.ErrUnexpectedEOF, []error{idemstore.ErrUnavailable}, nil},
		{"context canceled", context.Background(), fmt.Errorf("timeout: %w", context.Canceled), []error{context.Canceled}, []error{idemstore.ErrUnavailable}},
		{"deadline", context.Background(), context.DeadlineExceeded, []error{context.DeadlineExceeded}, nil},
		{"conn closed because ctx ended", cancelled, io.ErrUnexpectedEOF, []error{context.Canceled, io.ErrUnexpectedEOF}, []error{idemstore.ErrUnavailable}},
		{"other", context.Background(), pgx.ErrTxClosed, []error{pgx.ErrTxClosed}, []error{idemstore.ErrUnavailable, idemstore.ErrRetryable}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := interpretError(tc.ctx, tc.err)
			if !errors.Is(got, tc.err) {
				t.Errorf("%v does not wrap the original %v", got, tc.err)
			}
			for _, w := range tc.want {
				if !errors.Is(got, w) {
					t.Errorf("%v: not errors.Is %v", got, w)
				}
			}
			for _, n := range tc.not {
				if errors.Is(got, n) {
					t.Errorf("%v: unexpectedly errors.Is %v", got, n)
				}
			}
		})
	}
	if interpretError(context.Background(), nil) != nil {
		t.Error("interpretError(nil) != nil")
	}
}

func TestUpdateConflict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if updateConflict(interpretError(ctx, &pgconn.PgError{Code: "40001"})) == nil {
		t.Error("a serialization failure is not an update conflict")
	}
	for _, err := range []error{nil, idemstore.ErrLeaseLost, interpretError(ctx, &pgconn.PgError{Code: "40P01"})} {
		if updateConflict(err) != nil {
			t.Errorf("%v is an update conflict", err)
		}
	}
}

func TestConfigDefaultsAndValidation(t *testing.T) {
	t.Parallel()
	c := Config{}.withDefaults()
	if c.Schema != "public" || c.Channel != "idem_public" || c.ReserveRetries != 3 || c.ListenerRetry <= 0 {
		t.Errorf("defaults = %+v", c)
	}
	long := Config{Schema: "s" + string(make([]byte, 70))}.withDefaults()
	if len(long.Channel) > maxChannelLen {
		t.Errorf("default channel %d bytes", len(long.Channel))
	}
	for _, bad := range []Config{
		{Schema: string(make([]byte, 64))},
		{Channel: string(make([]byte, 64))},
		{ReserveRetries: -1},
	} {
		if err := bad.withDefaults().validate(); err == nil {
			t.Errorf("validate(%+v) = nil", bad)
		}
	}
	if _, err := New(nil, Config{}); err == nil {
		t.Error("New(nil pool) = nil error")
	}
}

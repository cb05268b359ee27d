package idemmysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/idem-dev/idem/internal/migrations"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-dev/idem/idemstore"
)

func TestInterpretError(t *testing.T) {
	t.Parallel()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	bg := context.Background()
	cases := []struct {
		name string
		ctx  context.Context
		err  error
		want []error
		not  []error
	}{
		{"duplicate", bg, &mysql.MySQLError{Number: 1062}, []error{errDuplicate}, []error{idemstore.ErrRetryable, idemstore.ErrUnavailable}},
		{"deadlock", bg, &mysql.MySQLError{Number: 1213}, []error{idemstore.ErrRetryable}, []error{errDuplicate}},
		{"lock wait timeout", bg, fmt.Errorf("x: %w", &mysql.MySQLError{Number: 1205}), []error{idemstore.ErrRetryable}, nil},
		{"too many connections", bg, &mysql.MySQLError{Number: 1040}, []error{idemstore.ErrUnavailable}, nil},
		{"syntax error", bg, &mysql.MySQLError{Number: 1064}, nil, []error{idemstore.ErrUnavailable, idemstore.ErrRetryable, errDuplicate}},
		{"bad conn", bg, driver.ErrBadConn, []error{idemstore.ErrUnavailable}, nil},
		{"invalid conn", bg, mysql.ErrInvalidConn, []error{idemstore.ErrUnavailable}, nil},
		{"conn done", bg, sql.ErrConnDone, []error{idemstore.ErrUnavailable}, nil},
		{"dial", bg, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, []error{idemstore.ErrUnavailable}, nil},
		{"closed db", bg, errors.New("sql: database is closed"), []error{idemstore.ErrUnavailable}, nil},
		{"canceled", bg, context.Canceled, []error{context.Canceled}, []error{idemstore.ErrUnavailable}},
		{"broken by cancel", cancelled, mysql.ErrInvalidConn, []error{context.Canceled}, []error{idemstore.ErrUnavailable}},
		{"other", bg, sql.ErrTxDone, []error{sql.ErrTxDone}, []error{idemstore.ErrUnavailable}},
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
	if interpretError(bg, nil) != nil {
		t.Error("interpretError(nil) != nil")
	}
}

func TestCheckKey(t *testing.T) {
	t.Parallel()
	ok := idemstore.Key{Scope: strings.Repeat("s", MaxScopeLen), Operation: strings.Repeat("o", MaxOperationLen), Key: strings.Repeat("k", MaxKeyLen)}
	if err := checkKey(ok); err != nil {
		t.Fatalf("longest key rejected: %v", err)
	}
	for name, k := range map[string]idemstore.Key{
		"scope":     {Scope: ok.Scope + "s"},
		"operation": {Operation: ok.Operation + "o"},
		"key":       {Key: ok.Key + "k"},
	} {
		if err := checkKey(k); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("over-long %s: %v", name, err)
		}
	}
}

func TestSplitStatements(t *testing.T) {
	t.Parallel()
	got := splitStatements("-- comment\nCREATE TABLE a (\n  x INT -- inline ok\n);\n\nCREATE INDEX i ON a (x);\n")
	if len(got) != 2 || !strings.HasPrefix(got[0], "CREATE TABLE a") || got[1] != "CREATE INDEX i ON a (x)" {
		t.Fatalf("splitStatements = %q", got)
	}
	ms, err := migrations.Load(migrationFS, "migrations")
	if err != nil || len(ms) != 3 || ms[0].Version != 1 || ms[1].Version != 2 || ms[2].Version != 3 {
		t.Fatalf("migrations.Load = %+v, %v", ms, err)
	}
	// 002 and 003: the instant column change and each online index build apart.
	for i, n := range []int{1, 2, 4} {
		if got := splitStatements(ms[i].SQL); len(got) != n {
			t.Errorf("%s splits into %q, want %d statements", ms[i].Name, got, n)
		}
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	if c := (Config{}).withDefaults(); c.ReserveRetries != 3 || c.validate() != nil {
		t.Errorf("defaults %+v invalid", c)
	}
	if err := (Config{ReserveRetries: -1}).withDefaults().validate(); err == nil {
		t.Error("negative ReserveRetries accepted")
	}
	if _, err := New(nil, Config{}); err == nil {
		t.Error("New(nil) accepted")
	}
}

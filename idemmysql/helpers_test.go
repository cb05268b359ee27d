package idemmysql_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-dev/idem/idemmysql"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

const dsnEnv = "IDEM_TEST_MYSQL_DSN"

// testDSN returns the parsed server DSN, skipping the test when it is not
// set (failing instead when CI=true).
func testDSN(tb testing.TB) *mysql.Config {
	tb.Helper()
	dsn := testenv.Getenv(tb, dsnEnv)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		tb.Fatalf("%s: %v", dsnEnv, err)
	}
	return cfg
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func openDB(tb testing.TB, cfg *mysql.Config) *sql.DB {
	tb.Helper()
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		tb.Fatal(err)
	}
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// newDatabase creates an empty migrated database of its own for one test,
// dropped in cleanup, and returns a handle on it whose sessions use
// isolation ("" for the server default, else e.g. "READ-COMMITTED").
func newDatabase(tb testing.TB, isolation string) (*sql.DB, *mysql.Config) {
	tb.Helper()
	base := testDSN(tb)
	name := "idem_t_" + randomHex(6)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := openDB(tb, base)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE "+name); err != nil {
			tb.Errorf("drop database %s: %v", name, err)
		}
	})
	cfg := base.Clone()
	cfg.DBName = name
	if isolation != "" {
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		// MariaDB before 11.1 calls it tx_isolation; MySQL 8 and MariaDB
		// 11.1+ accept transaction_isolation.
		cfg.Params["tx_isolation"] = "'" + isolation + "'"
	}
	db := openDB(tb, cfg)
	if err := idemmysql.Migrate(ctx, db, idemmysql.Config{}); err != nil {
		tb.Fatalf("Migrate: %v", err)
	}
	return db, cfg
}

func newStore(tb testing.TB, isolation string) (*idemmysql.Store, *sql.DB) {
	tb.Helper()
	return newStoreWith(tb, isolation, idemmysql.Config{})
}

// newStoreWith is newStore with cfg.
func newStoreWith(tb testing.TB, isolation string, cfg idemmysql.Config) (*idemmysql.Store, *sql.DB) {
	tb.Helper()
	db, _ := newDatabase(tb, isolation)
	s, err := idemmysql.New(db, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return s, db
}

// closedPortDB returns a handle on a loopback port nobody listens on.
func closedPortDB(tb testing.TB) *sql.DB {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "tcp", addr, "idem_test"
	cfg.Timeout = 5 * time.Second
	return openDB(tb, cfg)
}

// txLease is the part of an engine lease that CompleteTx needs.
type txLease struct {
	key       idemstore.Key
	token     string
	retention time.Duration
}

func (l txLease) PrepareTxComplete(resp *idemstore.Response) (idemstore.CompleteParams, error) {
	return idemstore.CompleteParams{Key: l.key, Token: l.token, Response: resp, Retention: l.retention}, nil
}

// isolationLevels maps the conformance suite's level names to database/sql's,
// which go-sql-driver/mysql sets with SET TRANSACTION ISOLATION LEVEL.
var isolationLevels = map[string]sql.IsolationLevel{
	"read committed":  sql.LevelReadCommitted,
	"repeatable read": sql.LevelRepeatableRead,
	"serializable":    sql.LevelSerializable,
}

// frozenClock is a moment the tests stop the server's clock at: 2026-10-25
// 00:30:00.123 UTC.
var frozenClock = time.UnixMilli(1792888200123).UTC()

// newFrozenStore returns a store on a database of its own whose sessions
// see the server's clock stopped at at (SET timestamp, which fixes NOW and
// UTC_TIMESTAMP) in time zone tz ("" for the server's), so that tests can
// judge expiry to the millisecond. It also returns the handle.
func newFrozenStore(tb testing.TB, at time.Time, tz string) (*idemmysql.Store, *sql.DB) {
	tb.Helper()
	_, cfg := newDatabase(tb, "")
	cfg = cfg.Clone()
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	// go-sql-driver/mysql sends unknown DSN parameters as SET name=value
	// on every new connection.
	cfg.Params["timestamp"] = fmt.Sprintf("%d.%06d", at.Unix(), at.Nanosecond()/1000)
	if tz != "" {
		cfg.Params["time_zone"] = "'" + tz + "'"
	}
	db := openDB(tb, cfg)
	s, err := idemmysql.New(db, idemmysql.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	return s, db
}

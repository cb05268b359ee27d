package storeurl

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// TestOpenServers opens each server store the environment names, migrated,
// and reserves one key through it.
func TestOpenServers(t *testing.T) {
	t.Parallel()
	for _, env := range []struct{ name, prefix string }{
		{"IDEM_TEST_POSTGRES_URL", ""},
		{"IDEM_TEST_MYSQL_DSN", "mysql://"},
		{"IDEM_TEST_REDIS_URL", ""},
		{"IDEM_TEST_REDIS_CLUSTER", "redis+cluster://"},
	} {
		t.Run(env.name, func(t *testing.T) {
			t.Parallel()
			v := testenv.Getenv(t, env.name)
			u := v
			if env.prefix != "" && !hasScheme(v) {
				u = env.prefix + v
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, closeFn, err := Open(ctx, u, Options{Migrate: true})
			if err != nil {
				t.Fatalf("Open(%s): %v", Redact(u), err)
			}
			defer closeFn()
			key := reserveOne(ctx, t, s, fmt.Sprint(time.Now().UnixNano()))
			if err := s.Release(ctx, idemstore.ReleaseParams{Key: key, Token: "t"}); err != nil {
				t.Fatalf("Release: %v", err)
			}
		})
	}
}

func hasScheme(s string) bool {
	for i := 0; i < len(s) && i < 20; i++ {
		if s[i] == ':' {
			return i+2 < len(s) && s[i+1] == '/' && s[i+2] == '/'
		}
	}
	return false
}

// TestOpenPostgresSchema checks that ?schema= puts idem's table in that
// schema, and that the store works there.
func TestOpenPostgresSchema(t *testing.T) {
	t.Parallel()
	base := testenv.Getenv(t, "IDEM_TEST_POSTGRES_URL")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgxpool.New(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close) // after the DROP below: cleanups run last-in first-out
	schema := fmt.Sprintf("storeurl_%d", time.Now().UnixNano())
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("dropping %s: %v", schema, err)
		}
	})

	s, closeFn, err := Open(ctx, testenv.WithParam(base, "schema", schema), Options{Migrate: true})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer closeFn()
	reserveOne(ctx, t, s, "schema")
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+schema+".idem_records WHERE key = $1", "schema").Scan(&n); err != nil {
		t.Fatalf("reading %s.idem_records: %v", schema, err)
	}
	if n != 1 {
		t.Fatalf("%s.idem_records holds %d records for the key, want 1", schema, n)
	}
}

// TestOpenRedisPrefix checks that ?prefix= starts the Redis keys the store
// writes.
func TestOpenRedisPrefix(t *testing.T) {
	t.Parallel()
	base := testenv.Getenv(t, "IDEM_TEST_REDIS_URL")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := fmt.Sprintf("storeurl%d", time.Now().UnixNano())
	s, closeFn, err := Open(ctx, testenv.WithParam(base, "prefix", prefix), Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer closeFn()
	key := reserveOne(ctx, t, s, "prefix")
	opts, err := redis.ParseURL(base)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opts)
	defer c.Close()
	// The record, and its entries in the search indexes: by key value and
	// by age.
	keys, err := c.Keys(ctx, prefix+":*").Result()
	if err != nil || len(keys) != 3 {
		t.Fatalf("keys under %s: %v, %v; want the one record and its two index sets", prefix, keys, err)
	}
	if err := s.Release(ctx, idemstore.ReleaseParams{Key: key, Token: "t"}); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// reserveOne reserves the key named name through s, with token "t", and
// returns it.
func reserveOne(ctx context.Context, t *testing.T, s idemstore.Store, name string) idemstore.Key {
	t.Helper()
	key := idemstore.Key{Scope: "storeurl-test", Operation: "POST /x", Key: name}
	if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: key, Fingerprint: "f", Token: "t", Lease: time.Minute}); err != nil || !created {
		t.Fatalf("Reserve = %v, %v", created, err)
	}
	return key
}

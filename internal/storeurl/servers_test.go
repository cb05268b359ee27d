package storeurl

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
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
			v := os.Getenv(env.name)
			if v == "" {
				if os.Getenv("CI") == "true" {
					t.Fatalf("%s is not set (CI=true); run scripts/services.sh", env.name)
				}
				t.Skipf("%s is not set; run scripts/services.sh to start the server", env.name)
			}
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
			now := time.Now()
			key := idemstore.Key{Scope: "storeurl-test", Operation: "POST /x", Key: fmt.Sprint(now.UnixNano())}
			if _, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: key, Fingerprint: "f", Token: "t", LeaseUntil: now.Add(time.Minute), Now: now}); err != nil || !created {
				t.Fatalf("Reserve = %v, %v", created, err)
			}
			if err := s.Release(ctx, key, "t"); err != nil {
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

package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/idemadmin"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/storeurl"
	"github.com/idem-dev/idem/internal/testenv"
)

func randomName() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// searchStoreURLs returns the --store URL of a fresh, migrated store of
// each kind: SQLite; PostgreSQL in a schema, MySQL in a database and
// Redis (a single node and a Cluster) under a prefix of its own (each dropped at cleanup; skipped
// without the server, failing with CI=true).
func searchStoreURLs(t *testing.T) map[string]string {
	urls := map[string]string{"sqlite": "sqlite://" + filepath.Join(t.TempDir(), "idem.db")}
	ctx := context.Background()

	pg := testenv.Getenv(t, "IDEM_TEST_POSTGRES_URL")
	schema := "idem_cli_" + randomName()
	urls["postgres"] = testenv.WithParam(pg, "schema", schema)
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, pg)
		if err == nil {
			_, err = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
			conn.Close(ctx)
		}
		if err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})

	dsn := testenv.Getenv(t, "IDEM_TEST_MYSQL_DSN")
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	db := "idem_cli_" + randomName()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.ExecContext(ctx, "DROP DATABASE "+db); err != nil {
			t.Errorf("dropping database %s: %v", db, err)
		}
	})
	hostPart, _, _ := strings.Cut(dsn, "/")
	urls["mysql"] = "mysql://" + hostPart + "/" + db

	urls["redis"] = testenv.WithParam(testenv.Getenv(t, "IDEM_TEST_REDIS_URL"), "prefix", "idem_cli_"+randomName())
	urls["redis-cluster"] = testenv.WithParam("redis+cluster://"+testenv.Getenv(t, "IDEM_TEST_REDIS_CLUSTER"), "prefix", "idem_cli_"+randomName())
	return urls
}

// openForTest opens the store of url, migrated, closed at cleanup.
func openForTest(t *testing.T, url string) idemstore.Store {
	t.Helper()
	target, err := storeurl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	s, closeFn, err := target.Connect(context.Background(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeFn() })
	return s
}

// cli runs the idem command line in process and returns what it printed
// and its exit code.
func cli(args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := Main(args, &out, &errb)
	return out.String(), errb.String(), code
}

// seed puts keys in a store: order-1001 in two scopes (one in review, one
// completed), order-1002 in review, each labelled.
func seed(t *testing.T, s idemstore.Store) {
	t.Helper()
	ctx := context.Background()
	for _, r := range []struct {
		scope, key, label string
		state             idemstore.State
	}{
		{"scope-b", "order-1001", "acct_7", idemstore.StateNeedsReview},
		{"scope-a", "order-1001", "acct_8", idemstore.StateCompleted},
		{"scope-a", "order-1002", "acct_7", idemstore.StateNeedsReview},
	} {
		k := idemstore.Key{Scope: r.scope, Operation: "POST /payments", Key: r.key}
		tok := "tok-" + r.scope + r.key
		if _, _, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: "fp", Token: tok, Lease: time.Hour, ScopeLabel: r.label,
			Request: &idemstore.Request{Method: "POST", Path: "/payments"}}); err != nil {
			t.Fatal(err)
		}
		var err error
		if r.state == idemstore.StateNeedsReview {
			err = s.Escalate(ctx, idemstore.EscalateParams{Key: k, Token: tok, Reason: "upstream timeout after send"})
		} else {
			err = s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Response: &idemstore.Response{Status: 201}, Retention: time.Hour})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestKeysSearchCommands: idem keys list finds a key by its value across
// scopes, on every store that searches, prints short IDs and labels that
// idem keys get and idem review resolve take back; a store that cannot
// search says so and still lists the review queue.
func TestKeysSearchCommands(t *testing.T) {
	t.Parallel()
	for kind, url := range searchStoreURLs(t) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s := openForTest(t, url)
			seed(t, s)
			if !s.Capabilities().Search {
				_, errOut, code := cli("keys", "list", "--store", url, "--key", "order-1001")
				if code == 0 || !strings.Contains(errOut, "not supported by this store") {
					t.Fatalf("keys list --key on a store that cannot search: exit %d, %s", code, errOut)
				}
				out, errOut, code := cli("review", "list", "--store", url)
				if code != 0 || !strings.Contains(out, "order-1001") || !strings.Contains(errOut, "key order") {
					t.Fatalf("review list on a store that cannot search: exit %d\n%s\n%s", code, out, errOut)
				}
				return
			}
			out, errOut, code := cli("keys", "list", "--store", url, "--key", "order-1001")
			if code != 0 {
				t.Fatalf("keys list --key: exit %d: %s", code, errOut)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "LABEL") {
				t.Fatalf("keys list --key printed:\n%s", out)
			}
			for _, l := range lines[1:] {
				if !strings.HasPrefix(l, "order-1001~") || !strings.Contains(l, "acct_") {
					t.Fatalf("a row without a short id or a label: %q", l)
				}
			}

			var items []idemadmin.Item
			out, _, _ = cli("keys", "list", "--store", url, "--label", "acct_7", "--json")
			if err := json.Unmarshal([]byte(out), &items); err != nil || len(items) != 2 {
				t.Fatalf("keys list --label --json: %v\n%s", err, out)
			}
			// Oldest first by default: order-1001 was reserved first.
			if items[0].Key != "order-1001" || items[1].Key != "order-1002" {
				t.Fatalf("keys list --label: %s then %s; want the oldest first", items[0].Key, items[1].Key)
			}
			out, _, _ = cli("review", "list", "--store", url, "--reason", "TIMEOUT", "--key-prefix", "order-100", "--order", "newest", "--json")
			if err := json.Unmarshal([]byte(out), &items); err != nil || len(items) != 2 || items[0].Key != "order-1002" {
				t.Fatalf("review list --reason --key-prefix --order newest: %v\n%s", err, out)
			}
			out, _, _ = cli("keys", "list", "--store", url, "--older-than", "48h")
			if strings.TrimSpace(out) != "No keys." {
				t.Fatalf("keys list --older-than 48h:\n%s", out)
			}

			// The short id of the key in review, taken back.
			short := items[1].ShortID
			out, errOut, code = cli("keys", "get", short, "--store", url)
			if code != 0 || !strings.Contains(out, "acct_7") || !strings.Contains(out, short) {
				t.Fatalf("keys get %s: exit %d\n%s%s", short, code, out, errOut)
			}
			out, errOut, code = cli("review", "resolve", short, "--store", url, "--attempt", items[1].Attempt, "--release", "--note", "never charged")
			if code != 0 || !strings.Contains(out, "Released") {
				t.Fatalf("review resolve %s: exit %d\n%s%s", short, code, out, errOut)
			}
			if _, errOut, code = cli("keys", "get", "order-1001~000000", "--store", url); code == 0 || !strings.Contains(errOut, "short id") {
				t.Fatalf("keys get of an unknown short id: exit %d: %s", code, errOut)
			}

			out, errOut, code = cli("keys", "counts", "--store", url)
			if code != 0 || !strings.Contains(out, "needs_review  1") || !strings.Contains(out, "POST /payments") {
				t.Fatalf("keys counts: exit %d\n%s%s", code, out, errOut)
			}
		})
	}
}

package capacity

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

func TestWorkloadShapes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	if s := scope(7); !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(s) || s == scope(8) {
		t.Errorf("scope(7) = %q: want 64 hex digits, distinct per client", s)
	}
	if scope(7) != scope(7+clients) {
		t.Error("scopes are not spread over exactly clients credentials")
	}
	for _, size := range []int{1 << 10, 16 << 10} {
		a := answer(r, size)
		if len(a) != size || !json.Valid(a) {
			t.Errorf("answer(%d): %d bytes, valid JSON %t", size, len(a), json.Valid(a))
		}
	}
	b := requestBody(r)
	if len(b) < 180 || len(b) > 240 || !json.Valid(b) {
		t.Errorf("request body: %d bytes, valid JSON %t, want about 200: %s", len(b), json.Valid(b), b)
	}

	s, err := idemmem.New(idemmem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := load(ctx, s, 50, 4, shape{answerSize: 1 << 10, storeBody: true, retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	page, err := s.List(ctx, idemstore.ListParams{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Records) != 50 {
		t.Fatalf("load stored %d records, want 50", len(page.Records))
	}
	for _, rec := range page.Records {
		if _, err := uuid.Parse(rec.Key.Key); err != nil || rec.State != idemstore.StateCompleted ||
			len(rec.Response.Body) != 1<<10 || len(rec.Request.Body) < 180 {
			t.Fatalf("record %+v: want a completed UUID key with a 1 KiB answer and the request body", rec)
		}
	}
}

// TestHeapGrowthCountsRecords checks the memory store's measurement: the
// heap grows by at least the answers' bytes for every record loaded.
func TestHeapGrowthCountsRecords(t *testing.T) {
	s, err := idemmem.New(idemmem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := memoryBackend(t)
	before, _, _ := b.size(t.Context())
	const n = 500
	if err := load(t.Context(), s, n, 4, shape{answerSize: 16 << 10, retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	after, _, _ := b.size(t.Context())
	if per := (after - before) / n; per < 16<<10 || per > 64<<10 {
		t.Errorf("heap grew %d bytes per record with a 16 KiB answer; want 16-64 KiB", per)
	}
}

func TestServerPIDs(t *testing.T) {
	ctx := t.Context()
	for _, u := range []string{"memory://", "sqlite://x.db"} {
		if f, err := serverPIDs(ctx, u); f != nil || err != nil {
			t.Errorf("serverPIDs(%q): want nil, nil for an in-process store (err %v)", u, err)
		}
	}
	u := testenv.Getenv(t, "IDEM_TEST_REDIS_URL")
	f, err := serverPIDs(ctx, testenv.WithParam(u, "prefix", "capacity-test"))
	if err != nil {
		t.Fatal(err)
	}
	pids := f()
	if len(pids) != 1 {
		t.Fatalf("serverPIDs(%s) = %v, want the one redis-server", u, pids)
	}
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pids[0])); strings.TrimSpace(string(comm)) != "redis-server" {
		t.Errorf("pid %d is %q, not redis-server", pids[0], comm)
	}
}

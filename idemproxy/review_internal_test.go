package idemproxy

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// TestReviewGauges: the gauges count the keys in review and how long the
// oldest has waited, by the store's clock.
func TestReviewGauges(t *testing.T) {
	t.Parallel()
	var now atomic.Int64
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	now.Store(start.UnixNano())
	store, err := idemmem.New(idemmem.Config{Now: func() time.Time { return time.Unix(0, now.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	engine, _ := idem.NewEngine(store, idem.EngineConfig{Logger: quiet})
	rv := newReview(Config{}, store, NewMetrics(), quiet)
	check := func(keys, oldest float64) {
		t.Helper()
		if err := rv.refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
		if k, o := testutil.ToFloat64(rv.keys), testutil.ToFloat64(rv.oldest); k != keys || o != oldest {
			t.Fatalf("idem_review_keys %v, idem_review_oldest_age_seconds %v; want %v and %v", k, o, keys, oldest)
		}
	}
	check(0, 0)
	for i, k := range []string{"a", "b", "c"} {
		res, err := engine.Begin(context.Background(), idem.Request{Key: idem.Key{Scope: "s", Operation: "POST /x", Key: k}, Fingerprint: "f"})
		if err != nil {
			t.Fatal(err)
		}
		if i < 2 {
			res.Lease.Escalate(context.Background(), "reset")
		}
		now.Add(int64(time.Minute))
	}
	check(2, 180) // a went to review at start, and three minutes passed
}

// TestOnReview: a key that goes to review is queued for the webhook, and
// kicks the gauges and the resolver; the engine logs it (once: onReview
// logs nothing of its own).
func TestOnReview(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	store, _ := idemmem.New(idemmem.Config{})
	defer store.Close()
	rv := newReview(Config{ReviewWebhook: "http://127.0.0.1:1/hook", Settings: Settings{ResolverURL: "http://127.0.0.1:1/resolve"}}, store, NewMetrics(), log)
	rv.onReview(context.Background(), idem.Key{Scope: "s", Operation: "POST /pay\n", Key: "order-7"}, "upstream reset")
	if buf.Len() != 0 {
		t.Errorf("onReview logged a line of its own:\n%s", buf.String())
	}
	if len(rv.hook.queue) != 1 || len(rv.refreshNow) != 1 || len(rv.recoverNow) != 1 {
		t.Errorf("queued %d events, kicked refresh %d, recover %d; want 1, 1, 1", len(rv.hook.queue), len(rv.refreshNow), len(rv.recoverNow))
	}
	ev := <-rv.hook.queue
	if ev.Method != "POST" || ev.Path != "/pay\n" || ev.Key != "order-7" || ev.ID == "" {
		t.Errorf("event %+v", ev)
	}
}

func TestRouteResolver(t *testing.T) {
	t.Parallel()
	cfg, err := ParseConfig([]byte(`
upstream: http://127.0.0.1:1
resolver_url: http://resolver/global
routes:
  - match: POST /payments
    resolver_url: http://resolver/payments
  - match: POST /refunds/{id}
  - match: /webhooks/
    disabled: true
`))
	if err != nil {
		t.Fatal(err)
	}
	rr := newRouteResolver(cfg, nil, quiet)
	for op, want := range map[string]string{
		"POST /payments":        "http://resolver/payments",
		"POST /refunds/7":       "http://resolver/global",
		"POST /webhooks/stripe": "",
		"POST /other":           "http://resolver/global",
		"PATCH /payments":       "http://resolver/global",
	} {
		got := ""
		if r := rr.pick(&idemstore.Record{Key: idemstore.Key{Operation: op}}); r != nil {
			got = r.URL
		}
		if got != want {
			t.Errorf("%s: resolver %q, want %q", op, got, want)
		}
	}
	if newRouteResolver(Config{Routes: cfg.Routes[1:2]}, nil, quiet) != nil {
		t.Error("a resolver without any URL")
	}
	res, err := rr.Resolve(context.Background(), &idemstore.Record{Key: idemstore.Key{Operation: "POST /webhooks/x"}})
	if err != nil || res.Verdict != idem.VerdictUnknown {
		t.Errorf("a route without a resolver: %+v, %v", res, err)
	}
}

func TestAdminTokens(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(file, []byte("ops:0123456789abcdef0123\n"), 0o600)
	extra := map[string]string{"admin": "fedcba9876543210fedc"}
	tokens, err := adminTokens(Config{Admin: ":0", AdminTokenFile: file}, extra)
	if err != nil || len(tokens) != 2 || tokens["ops"] == "" || tokens["admin"] == "" {
		t.Fatalf("file and extra: %v, %v", tokens, err)
	}
	if _, err := adminTokens(Config{Admin: ":0", AdminTokenFile: file}, map[string]string{"ops": "fedcba9876543210fedc"}); err == nil {
		t.Error("a name given twice")
	}
	if _, err := adminTokens(Config{AdminTokenFile: file}, nil); err == nil {
		t.Error("a token file without an admin listener")
	}
	if tokens, err := adminTokens(Config{}, extra); err != nil || tokens != nil {
		t.Errorf("IDEM_ADMIN_TOKEN without an admin listener: %v, %v; want it ignored", tokens, err)
	}
	if _, err := adminTokens(Config{Admin: ":0", AdminTokenFile: filepath.Join(t.TempDir(), "nosuch")}, nil); err == nil {
		t.Error("a missing token file")
	}
}

func TestHookURLs(t *testing.T) {
	t.Parallel()
	for _, y := range []string{
		"upstream: http://u\nresolver_url: ftp://x\n",
		"upstream: http://u\nreview_webhook: /relative\n",
		"upstream: http://u\nroutes:\n  - match: POST /p\n    resolver_url: 'http://'\n",
	} {
		cfg, err := ParseConfig([]byte(y))
		if err == nil {
			err = cfg.WithDefaults().Validate()
		}
		if err == nil {
			t.Errorf("accepted:\n%s", y)
		}
	}
	cfg, err := ParseConfig([]byte("upstream: http://u\nstore_request: true\nroutes:\n  - match: POST /p\n  - match: POST /q\n    store_request: false\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Routes[0].Settings.merge(cfg.Settings).policy().StoreRequestBody || cfg.Routes[1].Settings.merge(cfg.Settings).policy().StoreRequestBody {
		t.Error("store_request does not reach the policy")
	}
}

// TestLoop: a kick runs at once, a second kick within minGap waits for
// it, and the ticker runs on its own.
func TestLoop(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		kicks := make(chan struct{}, 1)
		var runs atomic.Int32
		done := make(chan struct{})
		go func() { loop(ctx, time.Hour, kicks, time.Second, func() { runs.Add(1) }); close(done) }()
		want := func(n int32) {
			t.Helper()
			synctest.Wait()
			if got := runs.Load(); got != n {
				t.Fatalf("%d runs, want %d", got, n)
			}
		}
		kick(kicks)
		want(1)
		kick(kicks)
		kick(kicks) // merged with the one before
		want(1)
		time.Sleep(time.Second)
		want(2)
		time.Sleep(time.Hour)
		want(3)
		cancel()
		<-done
	})
}

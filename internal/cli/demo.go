package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemproxy"
)

func init() { extraCommands = append(extraCommands, newDemoCmd) }

type demoFlags struct {
	listen, store string
	noRun, serve  bool
	exit          bool // the old --exit: stopping is now the default
}

func newDemoCmd() *cobra.Command {
	var f demoFlags
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the proxy in front of a built-in payments API and show what it does",
		Long: `demo starts a small payments API that counts how often it runs, puts
"idem serve" in front of it (SQLite store in a temporary directory), and walks
through five cases in six requests, printing each request and answer:

  1. a first payment: the API runs it;
  2. the same request again (a retry): the stored answer is replayed;
  3. the same key with another amount: 422, the key was used for something else;
  4. a slow payment, and its retry while it is still running: 409 with
     Retry-After (two requests; the first one's answer follows);
  5. no Idempotency-Key: 400.

The API runs twice in all: once for step 1, once for the slow payment.

It then stops, and says so. With --serve it keeps the proxy and the API
running instead, printing curl commands to try and one line per request,
until Ctrl-C.`,
		Example: `  idem demo                 # walk through the five cases, then stop
  idem demo --serve         # walk through them, then keep serving until Ctrl-C
  idem demo --no-run        # only serve, and print the curl commands`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "127.0.0.1:8080", "where the proxy listens (a free port is chosen if this one is taken)")
	fl.StringVar(&f.store, "store", "", "store URL (default: SQLite in a temporary directory, removed on exit)")
	fl.BoolVar(&f.noRun, "no-run", false, "do not send the six example requests; only serve (implies --serve)")
	fl.BoolVar(&f.serve, "serve", false, "keep serving after the six example requests, until Ctrl-C")
	fl.BoolVar(&f.exit, "exit", false, "stop after the six example requests (the default; kept for old scripts)")
	_ = fl.MarkHidden("exit")
	return cmd
}

// demoAPI is the upstream: POST /payments counts its executions.
type demoAPI struct{ runs atomic.Int64 }

func (a *demoAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/payments" {
		http.NotFound(w, r)
		return
	}
	if r.Method == http.MethodGet {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"executions":%d}`+"\n", a.runs.Load())
		return
	}
	if r.Method != http.MethodPost {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	var in struct {
		Amount   int    `json:"amount"`
		Currency string `json:"currency"`
	}
	json.NewDecoder(r.Body).Decode(&in)
	n := a.runs.Add(1)
	if d, err := time.ParseDuration(r.URL.Query().Get("sleep")); err == nil && d > 0 && d <= 30*time.Second {
		time.Sleep(d)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"payment":"pay_%d","amount":%d,"currency":%q,"executions":%d}`+"\n", n, in.Amount, in.Currency, n)
}

func runDemo(ctx context.Context, stdout, stderr io.Writer, f demoFlags) error {
	api := &demoAPI{}
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	apiSrv := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second}
	go apiSrv.Serve(apiLn)
	defer apiSrv.Close()

	store := f.store
	if store == "" {
		dir, err := os.MkdirTemp("", "idem-demo")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		store = "sqlite://" + filepath.Join(dir, "idem-demo.db")
	}
	listen := f.listen
	if ln, err := net.Listen("tcp", listen); err != nil {
		fmt.Fprintf(stdout, "(%s is taken; using a free port)\n", listen)
		listen = "127.0.0.1:0"
	} else {
		ln.Close()
	}
	cfg := idemproxy.Config{Upstream: "http://" + apiLn.Addr().String(), Listen: listen, Store: store, ShutdownTimeout: idemproxy.Duration(5 * time.Second)}.WithDefaults()
	lease := idemproxy.Duration(10 * time.Second) // a short Retry-After in step 4
	cfg.Lease = &lease
	// The demo's requests carry no credentials: they share one scope.
	cfg.Anonymous = idemproxy.AnonymousShared
	log := slog.New(dropScopeWarnings{slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})})

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		out      sync.Mutex
		walking  atomic.Bool
		demoDone = make(chan struct{})
	)
	printf := func(format string, args ...any) {
		out.Lock()
		fmt.Fprintf(stdout, format, args...)
		out.Unlock()
	}
	walking.Store(!f.noRun)
	return runServe(ctx, cfg, log, func(s *idemproxy.Server) {
		s.OnOutcome = func(ev idem.Event) {
			if walking.Load() {
				return // the walkthrough prints its own requests
			}
			printf("%s  %-22s %-13s %d %s\n", time.Now().Format("15:04:05"), ev.Operation, ev.Outcome, ev.Status, ev.Settlement)
		}
		s.Ready = func(addr, _ net.Addr) {
			base := "http://" + addr.String()
			printf("idem demo: the proxy on %s guards a payments API (store %s).\n", base, store)
			printf("The requests below carry no credentials, so they share one scope (--anonymous shared);\nin front of your API, keys are scoped by each client's Authorization header.\n\n")
			go func() {
				defer close(demoDone)
				if !f.noRun {
					walkthrough(ctx, base, api, printf)
				}
				walking.Store(false)
				if !f.serve && !f.noRun {
					printf("The demo is done and has stopped the proxy and the API.\nRun \"idem demo --serve\" to keep them running and try requests of your own.\n")
					cancel()
					return
				}
				printf("\nThe proxy keeps running until you press Ctrl-C. Try it yourself:\n\n")
				key := fmt.Sprintf("try-%d", time.Now().Unix()%100000)
				printf("  curl -i -X POST %s/payments -H 'Idempotency-Key: %s' -H 'Content-Type: application/json' -d '{\"amount\":500,\"currency\":\"eur\"}'\n", base, key)
				printf("  curl -i -X POST '%s/payments?sleep=10s' -H 'Idempotency-Key: %s-slow' -d '{}'   # then the same again at once: 409\n", base, key)
				printf("  curl -i %s/payments                                 # GET passes through: the execution count\n\n", base)
			}()
		}
	})
}

// walkthrough sends the six example requests (five cases) through the proxy at base
// and prints each exchange.
func walkthrough(ctx context.Context, base string, api *demoAPI, printf func(string, ...any)) {
	type step struct {
		title, key, body, query string
	}
	show := func(n int, s step) {
		printf("── %d. %s\n", n, s.title)
		printf("$ %s\n", curlLine(base+"/payments"+s.query, s.key, s.body))
		a, err := send(ctx, base+"/payments"+s.query, s.key, s.body)
		if err != nil {
			printf("error: %v\n\n", err)
			return
		}
		printf("%s\n\n", a)
	}
	pay := `{"amount":1000,"currency":"eur"}`
	show(1, step{title: "A first payment: the API runs it.", key: "order-1001", body: pay})
	show(2, step{title: "The client retries (same key, same request): the stored answer is replayed, the API does not run again.", key: "order-1001", body: `{"currency":"eur","amount":1000}`})
	show(3, step{title: "The same key with another amount: 422, a key belongs to one request.", key: "order-1001", body: `{"amount":2000,"currency":"eur"}`})

	slow := step{key: "order-1002", body: pay, query: "?sleep=2s"}
	first := make(chan string, 1)
	go func() {
		a, err := send(ctx, base+"/payments"+slow.query, slow.key, slow.body)
		if err != nil {
			a = "error: " + err.Error()
		}
		first <- a
	}()
	for i := 0; i < 200 && api.runs.Load() < 2; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	slow.title = "A retry while the first attempt (2s, still running) is in flight: 409 with Retry-After."
	show(4, slow)
	printf("   …and the first attempt, when it finishes:\n%s\n\n", <-first)
	show(5, step{title: "No Idempotency-Key on a POST: 400.", body: pay})
	printf("The payments API ran %d times for these 6 requests.\n", api.runs.Load())
}

func curlLine(url, key, body string) string {
	var b strings.Builder
	b.WriteString("curl -i -X POST '" + url + "'")
	if key != "" {
		b.WriteString(" -H 'Idempotency-Key: " + key + "'")
	}
	b.WriteString(" -H 'Content-Type: application/json' -d '" + body + "'")
	return b.String()
}

// send posts body and formats the answer: status line, the headers that
// matter here, body.
func send(ctx context.Context, url, key, body string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var s strings.Builder
	fmt.Fprintf(&s, "HTTP %s", resp.Status)
	for _, h := range []string{"Idempotency-Outcome", "Idempotent-Replayed", "Retry-After", "Content-Type"} {
		if v := resp.Header.Get(h); v != "" {
			fmt.Fprintf(&s, "\n%s: %s", h, v)
		}
	}
	fmt.Fprintf(&s, "\n%s", strings.TrimRight(string(b), "\n"))
	return s.String(), nil
}

// dropScopeWarnings leaves out the proxy's startup warnings about scopes:
// the demo says itself that its requests share one scope.
type dropScopeWarnings struct{ slog.Handler }

func (h dropScopeWarnings) Handle(ctx context.Context, r slog.Record) error {
	scope := false
	r.Attrs(func(a slog.Attr) bool {
		scope = a.Equal(idemproxy.ScopeWarning)
		return !scope
	})
	if scope {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h dropScopeWarnings) WithAttrs(as []slog.Attr) slog.Handler {
	return dropScopeWarnings{h.Handler.WithAttrs(as)}
}

func (h dropScopeWarnings) WithGroup(name string) slog.Handler {
	return dropScopeWarnings{h.Handler.WithGroup(name)}
}

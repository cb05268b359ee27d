package frontdoors_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/gorilla/mux"
	"github.com/labstack/echo/v4"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
)

// protect is idem's HTTP middleware over a memory store, scoped by X-User.
func protect(t *testing.T, cfg idem.Config) func(http.Handler) http.Handler {
	store := idemmem.MustNew(idemmem.Config{})
	t.Cleanup(func() { store.Close() })
	e, err := idem.NewEngine(store, idem.EngineConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Scope, cfg.Logger = func(r *http.Request) (string, error) { return "user:" + r.Header.Get("X-User"), nil }, quiet
	return idem.Middleware(e, cfg)
}

// post sends a POST with a key and returns the status, body and whether it
// was a replay.
func post(t *testing.T, url, key, body string) (int, string, bool) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User", "alice")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed") == "true"
}

// checkRecipe: the first POST runs (201), its retry is the replay, and
// another body under the key is a 422; the handler ran once.
func checkRecipe(t *testing.T, url string, runs *atomic.Int64) {
	t.Helper()
	s1, b1, r1 := post(t, url, "k1", `{"amount":5}`)
	s2, b2, r2 := post(t, url, "k1", `{"amount":5}`)
	s3, _, _ := post(t, url, "k1", `{"amount":6}`)
	if s1 != 201 || r1 || s2 != 201 || !r2 || b1 != b2 || s3 != 422 || runs.Load() != 1 {
		t.Fatalf("first %d %q %v, retry %d %q %v, reuse %d, runs %d", s1, b1, r1, s2, b2, r2, s3, runs.Load())
	}
}

// TestGin: gin's middleware is not net/http's, and its handlers write to
// gin's own ResponseWriter, so the recipe wraps the whole engine (an
// http.Handler) in one line. Operations are then the method and path.
func TestGin(t *testing.T) {
	t.Parallel()
	gin.SetMode(gin.ReleaseMode)
	var runs atomic.Int64
	r := gin.New()
	r.POST("/orders/:id/pay", func(c *gin.Context) {
		c.JSON(http.StatusCreated, gin.H{"order": c.Param("id"), "run": runs.Add(1)})
	})
	srv := httptest.NewServer(protect(t, idem.Config{})(r)) // the recipe
	defer srv.Close()
	checkRecipe(t, srv.URL+"/orders/7/pay", &runs)
}

// TestEcho: echo.WrapMiddleware takes net/http middleware as it is, on
// the router or on a group or route.
func TestEcho(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	e := echo.New()
	e.Use(echo.WrapMiddleware(protect(t, idem.Config{}))) // the recipe
	e.POST("/orders/:id/pay", func(c echo.Context) error {
		return c.JSON(http.StatusCreated, map[string]any{"order": c.Param("id"), "run": runs.Add(1)})
	})
	srv := httptest.NewServer(e)
	defer srv.Close()
	checkRecipe(t, srv.URL+"/orders/7/pay", &runs)
}

// TestGorillaMux: mux.Router.Use takes net/http middleware; gorilla/mux
// sets no r.Pattern, so Config.Operation reads the route's template.
func TestGorillaMux(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	var ops []string
	r := mux.NewRouter()
	r.Use(protect(t, idem.Config{ // the recipe
		Operation: func(r *http.Request) string {
			if tpl, err := mux.CurrentRoute(r).GetPathTemplate(); err == nil {
				return r.Method + " " + tpl
			}
			return idem.DefaultOperation(r)
		},
		OnOutcome: func(ev idem.Event) { ops = append(ops, ev.Operation) },
	}))
	r.HandleFunc("/orders/{id}/pay", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%q,"run":%d}`, mux.Vars(r)["id"], runs.Add(1))
	}).Methods("POST")
	srv := httptest.NewServer(r)
	defer srv.Close()
	checkRecipe(t, srv.URL+"/orders/7/pay", &runs)
	if ops[0] != "POST /orders/{id}/pay" {
		t.Fatalf("operation %q", ops[0])
	}
}

// TestFiber: Fiber runs on fasthttp, not net/http. Its adaptor's
// HTTPMiddleware does not work for idem: it runs the middleware to the
// end before the Fiber handler, so the middleware stores an empty answer
// and every retry gets that empty 200 instead of the handler's (shown
// below). What works is to
// serve the Fiber app through net/http with adaptor.FiberApp, behind the
// middleware.
func TestFiber(t *testing.T) {
	t.Parallel()
	newApp := func(runs *atomic.Int64, use ...fiber.Handler) *fiber.App {
		app := fiber.New(fiber.Config{DisableStartupMessage: true})
		for _, h := range use {
			app.Use(h)
		}
		app.Post("/orders/:id/pay", func(c *fiber.Ctx) error {
			return c.Status(http.StatusCreated).JSON(fiber.Map{"order": c.Params("id"), "run": runs.Add(1)})
		})
		return app
	}
	var runs atomic.Int64
	srv := httptest.NewServer(protect(t, idem.Config{})(adaptor.FiberApp(newApp(&runs)))) // the recipe
	defer srv.Close()
	checkRecipe(t, srv.URL+"/orders/7/pay", &runs)

	var broken atomic.Int64
	app := newApp(&broken, adaptor.HTTPMiddleware(protect(t, idem.Config{})))
	bsrv := httptest.NewServer(adaptor.FiberApp(app))
	defer bsrv.Close()
	s1, b1, _ := post(t, bsrv.URL+"/orders/7/pay", "k1", `{"amount":5}`)
	s2, b2, replay := post(t, bsrv.URL+"/orders/7/pay", "k1", `{"amount":5}`)
	if s1 != 201 || !replay || s2 != 200 || b2 != "" || b1 == "" {
		t.Fatalf("adaptor.HTTPMiddleware: first %d %q, retry %d %q replayed %v: if it now protects, update the docs", s1, b1, s2, b2, replay)
	}
}

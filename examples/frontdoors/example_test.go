package frontdoors_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/gorilla/mux"
	"github.com/labstack/echo/v4"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
)

// middleware is idem's HTTP middleware over a memory store, each caller
// scoped by its X-User header (in a real service: the authenticated user).
func middleware(cfg idem.Config) func(http.Handler) http.Handler {
	e, err := idem.NewEngine(idemmem.MustNew(idemmem.Config{}), idem.EngineConfig{Logger: quiet})
	if err != nil {
		panic(err)
	}
	cfg.Scope = func(r *http.Request) (string, error) { return "user:" + r.Header.Get("X-User"), nil }
	cfg.Logger = quiet
	return idem.Middleware(e, cfg)
}

// payTwice sends the same payment twice under one key, as a client whose
// first answer was lost would, and prints both answers.
func payTwice(h http.Handler) {
	srv := httptest.NewServer(h)
	defer srv.Close()
	for range 2 {
		req, _ := http.NewRequest("POST", srv.URL+"/orders/7/pay", strings.NewReader(`{"amount":5}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User", "alice")
		req.Header.Set("Idempotency-Key", "pay-7-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
}

// Gin's middleware is not net/http's, so the recipe wraps the whole
// engine, which is an http.Handler. Operations are the method and path.
func Example_gin() {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.POST("/orders/:id/pay", func(c *gin.Context) {
		c.JSON(http.StatusCreated, gin.H{"order": c.Param("id")})
	})
	payTwice(middleware(idem.Config{})(r))
	// Output:
	// 201 replayed: false
	// 201 replayed: true
}

// Echo takes net/http middleware through echo.WrapMiddleware, on the
// router, a group or a route.
func Example_echo() {
	e := echo.New()
	e.Use(echo.WrapMiddleware(middleware(idem.Config{})))
	e.POST("/orders/:id/pay", func(c echo.Context) error {
		return c.JSON(http.StatusCreated, map[string]string{"order": c.Param("id")})
	})
	payTwice(e)
	// Output:
	// 201 replayed: false
	// 201 replayed: true
}

// gorilla/mux takes net/http middleware with Router.Use. It sets no
// r.Pattern, so Config.Operation reads the route's template: every order
// shares one operation.
func Example_gorillaMux() {
	r := mux.NewRouter()
	r.Use(middleware(idem.Config{
		Operation: func(r *http.Request) string {
			if tpl, err := mux.CurrentRoute(r).GetPathTemplate(); err == nil {
				return r.Method + " " + tpl
			}
			return idem.DefaultOperation(r)
		},
	}))
	r.HandleFunc("/orders/{id}/pay", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%q}`, mux.Vars(r)["id"])
	}).Methods("POST")
	payTwice(r)
	// Output:
	// 201 replayed: false
	// 201 replayed: true
}

// Fiber runs on fasthttp. Its adaptor.HTTPMiddleware does not work for
// idem (it runs the middleware to its end before the Fiber handler), so
// the recipe serves the Fiber app through net/http with
// adaptor.FiberApp, behind the middleware.
func Example_fiber() {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Post("/orders/:id/pay", func(c *fiber.Ctx) error {
		return c.Status(http.StatusCreated).JSON(fiber.Map{"order": c.Params("id")})
	})
	payTwice(middleware(idem.Config{})(adaptor.FiberApp(app)))
	// Output:
	// 201 replayed: false
	// 201 replayed: true
}

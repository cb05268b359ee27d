// Command fiberpeer serves the handler of internal/tools/benchserver with
// Fiber (fasthttp), bare or behind Fiber's own idempotency middleware on its
// memory storage: the peer that scripts/bench-http.sh holds idem's
// middleware against. It is a module of its own, so that Fiber never enters
// the go.mod of idem's users; the script builds it with GOWORK=off.
//
//	go build -o fiberpeer . && ./fiberpeer -addr 127.0.0.1:18080 -mode bare|idempotency
package main

import (
	"errors"
	"flag"
	"log"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/idempotency"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18080", "listen address")
	mode := flag.String("mode", "bare", "bare or idempotency")
	flag.Parse()

	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	switch *mode {
	case "bare":
	case "idempotency":
		app.Use(idempotency.New(idempotency.Config{
			// As idem: the IETF draft's header, any key of 1 to 255 bytes,
			// and answers kept for a day.
			KeyHeader: "Idempotency-Key",
			KeyHeaderValidate: func(k string) error {
				if len(k) == 0 || len(k) > 255 {
					return errors.New("invalid Idempotency-Key")
				}
				return nil
			},
			Lifetime: 24 * time.Hour,
		}))
	default:
		log.Fatalf("fiberpeer: unknown mode %q", *mode)
	}
	app.All("/*", func(c *fiber.Ctx) error {
		c.Set("Content-Type", "application/json")
		return c.Status(fiber.StatusCreated).SendString(`{"id":"pay_1","amount":1000,"currency":"usd"}`)
	})
	log.Printf("fiberpeer: %s on %s", *mode, *addr)
	log.Fatal(app.Listen(*addr))
}

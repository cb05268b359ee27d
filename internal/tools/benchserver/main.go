// Command benchserver serves a small JSON handler on loopback, bare or
// behind idem's middleware, for the HTTP load runs in BENCHMARKS.md.
//
//	go run ./internal/tools/benchserver -addr 127.0.0.1:18080 -mode bare|memory|sqlite|floor [-read-body]
//
// floor is not idem: it is the least an idempotency middleware must do for
// a fresh key (see floor.go), to measure idem's middleware against.
package main

import (
	"flag"
	"io"
	"log"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18080", "listen address")
	mode := flag.String("mode", "bare", "bare, memory, sqlite or floor")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile here until SIGINT")
	retention := flag.Duration("retention", 24*time.Hour, "how long completed keys are kept")
	readBody := flag.Bool("read-body", false, "the handler reads the request body, as an API that decodes it does (net/http then watches the connection while it runs: a goroutine per request)")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt)
		go func() {
			<-sig
			pprof.StopCPUProfile()
			f.Close()
			os.Exit(0)
		}()
	}

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if *readBody {
			_, _ = io.Copy(io.Discard, r.Body)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"pay_1","amount":1000,"currency":"usd"}`))
	})
	var h http.Handler = handler
	if *mode == "floor" {
		h = newFloor(handler)
	} else if *mode != "bare" {
		var store idemstore.Store
		switch *mode {
		case "memory":
			store = idemmem.MustNew(idemmem.Config{})
		case "sqlite":
			dir, err := os.MkdirTemp("", "benchserver")
			if err != nil {
				log.Fatal(err)
			}
			defer os.RemoveAll(dir)
			db, err := idemsqlite.Open(filepath.Join(dir, "idem.db"), idemsqlite.OpenOptions{})
			if err != nil {
				log.Fatal(err)
			}
			if store, err = idemsqlite.New(db, idemsqlite.Config{}); err != nil {
				log.Fatal(err)
			}
		default:
			log.Fatalf("benchserver: unknown mode %q", *mode)
		}
		e, err := idem.NewEngine(store, idem.EngineConfig{Logger: slog.New(slog.DiscardHandler), Retention: *retention})
		if err != nil {
			log.Fatal(err)
		}
		h = idem.Middleware(e, idem.Config{Scope: idem.GlobalScope})(handler)
	}
	log.Printf("benchserver: %s on %s", *mode, *addr)
	log.Fatal(http.ListenAndServe(*addr, h))
}

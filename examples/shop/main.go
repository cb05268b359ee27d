// Command shop is an example shop that uses every safeguard against doing
// a thing twice, with idem's middleware in front of its handlers:
//
//   - an Idempotency-Key on every POST that changes an order, scoped to the
//     session's user, made by the checkout page when it loads and sent with
//     every retry;
//   - a unique constraint on the business data: one order per (user,
//     client order ID);
//   - guarded state transitions (pending → paid → shipped), each an UPDATE
//     … WHERE state = … that changes one row or is refused, and stock that
//     cannot go below zero;
//   - a payment provider (a double, run in-process) that charges at most
//     once per key, and a resolver that asks it, with the same key, what
//     became of a payment whose outcome was unknown;
//   - each order and the answer that reports it committed together
//     (CompleteTx).
//
// Run it with
//
//	go run ./examples/shop
//
// and open the URL it prints ("shop listening url=…"): it picks free
// ports, as idem demo does, unless --listen and --provider-listen name
// them. The README beside this file walks through every scenario with curl.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "shop:", err)
		os.Exit(1)
	}
}

// run starts the shop and its payment provider and serves until ctx ends.
// ready, if set, is told the addresses they listen on.
func run(ctx context.Context, args []string, stderr io.Writer, ready func(shop, provider string)) error {
	fs := flag.NewFlagSet("shop", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "address the shop listens on (port 0: a free one, printed at start)")
	dbArg := fs.String("db", "shop.db", "the shop's database: a SQLite file, or a postgres:// URL")
	pgSchema := fs.String("pg-schema", "public", "PostgreSQL schema for the shop's and idem's tables (created if missing)")
	providerListen := fs.String("provider-listen", "127.0.0.1:0", "address the payment provider's double listens on (port 0: a free one, printed at start)")
	providerDB := fs.String("provider-db", "provider.db", "SQLite file where the payment provider's double keeps its charges")
	providerTimeout := fs.Duration("provider-timeout", 3*time.Second, "how long a call to the payment provider may take")
	lease := fs.Duration("lease", 30*time.Second, "how long a request holds its key before recovery may decide its process died")
	recoverEvery := fs.Duration("recover-every", 5*time.Second, "how often expired leases and keys in review are settled")
	faults := fs.Bool("faults", false, "serve POST /debug/crash, which makes the next payment crash the shop")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *recoverEvery <= 0 {
		return errors.New("--recover-every must be positive")
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	clk := wallClock{}

	prov, err := openProvider(*providerDB, clk, log)
	if err != nil {
		return fmt.Errorf("payment provider: %w", err)
	}
	defer prov.close()
	provLn, err := net.Listen("tcp", *providerListen)
	if err != nil {
		return fmt.Errorf("payment provider: %w", err)
	}
	provSrv := &http.Server{Handler: prov.handler(), ReadHeaderTimeout: 10 * time.Second}
	go provSrv.Serve(provLn) //nolint:errcheck // ends with Close
	defer provSrv.Close()

	var db database
	if strings.HasPrefix(*dbArg, "postgres://") || strings.HasPrefix(*dbArg, "postgresql://") {
		db, err = openPostgres(ctx, *dbArg, *pgSchema)
	} else {
		db, err = openSQLite(*dbArg, clk)
	}
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer db.close()
	pay := &payments{base: "http://" + provLn.Addr().String(), hc: &http.Client{}, timeout: *providerTimeout, clk: clk}
	s, err := newShop(ctx, shopConfig{DB: db, Payments: pay, Clock: clk, Logger: log, Lease: *lease, Faults: *faults})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 10 * time.Second}
	recovering := make(chan struct{})
	go func() {
		defer close(recovering)
		s.recoverLoop(ctx, *recoverEvery)
	}()
	defer func() { cancelRun(); <-recovering }() // before the database closes
	log.Info("shop listening", "url", "http://"+ln.Addr().String()+"/", "provider", pay.base, "db", redactURL(*dbArg))
	if ready != nil {
		ready(ln.Addr().String(), provLn.Addr().String())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// redactURL hides a password in a database URL, for the log.
func redactURL(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	userinfo, host, ok := strings.Cut(rest, "@")
	if !ok {
		return s
	}
	if user, _, hasPass := strings.Cut(userinfo, ":"); hasPass {
		return scheme + "://" + user + ":xxxxx@" + host
	}
	return s
}

// Command worker is a River worker on PostgreSQL whose jobs pay money out to
// a ledger exactly once, though River delivers each job at least once: the
// ledger row is written with idem.DoTx, in the same transaction as idem's
// record of the payout, so a job delivered again after its payout committed
// (its worker died before River heard of it) writes nothing more.
//
//	worker -database postgres://localhost/app -enqueue 3   # enqueue three payouts and work them
//	worker -database postgres://localhost/app              # work until interrupted
//
// Everything lives in one schema (-schema): River's tables, idem's, and the
// ledger. See payout.go for the worker itself.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	database := flag.String("database", os.Getenv("DATABASE_URL"), "PostgreSQL URL (default $DATABASE_URL)")
	schema := flag.String("schema", "payouts_demo", "schema for River's, idem's and the ledger's tables")
	enqueue := flag.Int("enqueue", 0, "enqueue this many payouts before working")
	flag.Parse()
	if err := run(*database, *schema, *enqueue); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func run(database, schema string, enqueue int) error {
	if database == "" {
		return fmt.Errorf("no database: set -database or DATABASE_URL")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, database)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := Migrate(ctx, pool, schema); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	client, store, _, err := NewWorker(pool, schema, Options{Logger: logger})
	if err != nil {
		return err
	}
	defer store.Close()
	for i := 1; i <= enqueue; i++ {
		args := PayoutArgs{PayoutID: fmt.Sprintf("po_%d", i), Account: "acct_42", Amount: 500}
		if _, err := client.Insert(ctx, args, nil); err != nil {
			return err
		}
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done() // a signal: River stops softly, finishing running jobs
	<-client.Stopped()
	return nil
}

package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idempg"
)

// Migrate creates schema and everything the worker keeps in it: River's
// tables, idem's tables, and the ledger. River, idem and the ledger share
// the database, so the ledger row and idem's record commit together.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema})
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	if err := idempg.Migrate(ctx, pool, idempg.Config{Schema: schema}); err != nil {
		return fmt.Errorf("idem migrations: %w", err)
	}
	// No unique constraint on payout_id: exactly once is idem's doing here.
	_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+pgx.Identifier{schema, "ledger"}.Sanitize()+` (
		id bigserial PRIMARY KEY,
		payout_id text NOT NULL,
		account text NOT NULL,
		amount bigint NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`)
	return err
}

// Options tune the worker.
type Options struct {
	// Lease is idem's lease on a running payout: how long after a worker
	// died another may take its payout over. Defaults to 30s.
	Lease time.Duration
	// River is the River configuration; Workers, Schema and Logger are set
	// by NewWorker. Defaults to one default queue of 10 workers.
	River river.Config
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// NewWorker returns a River client that works payouts from schema, and the
// idem store it pays out through. Close the store after the client stopped.
func NewWorker(pool *pgxpool.Pool, schema string, opts Options) (*river.Client[pgx.Tx], *idempg.Store, *PayoutWorker, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	store, err := idempg.New(pool, idempg.Config{Schema: schema})
	if err != nil {
		return nil, nil, nil, err
	}
	engine, err := idem.NewEngine(store, idem.EngineConfig{Lease: opts.Lease, Logger: opts.Logger})
	if err != nil {
		store.Close()
		return nil, nil, nil, err
	}
	w := &PayoutWorker{Engine: engine, Pool: pool, Schema: schema, Logger: opts.Logger}
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, w); err != nil {
		store.Close()
		return nil, nil, nil, err
	}
	cfg := opts.River
	if cfg.Queues == nil {
		cfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}}
	}
	cfg.Workers, cfg.Schema, cfg.Logger = workers, schema, opts.Logger
	client, err := river.NewClient(riverpgxv5.New(pool), &cfg)
	if err != nil {
		store.Close()
		return nil, nil, nil, err
	}
	return client, store, w, nil
}

// NewInserter returns a River client that only enqueues payouts into schema.
func NewInserter(pool *pgxpool.Pool, schema string) (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	river.AddWorker(workers, &PayoutWorker{})
	return river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: schema, Workers: workers, Logger: slog.New(slog.DiscardHandler)})
}

package main

import (
	"context"
	"strings"
)

// schema returns the shop's tables, with id as the orders' key column type
// (the one thing SQLite and PostgreSQL spell differently). Each table
// carries one of the safeguards:
//
//   - orders: UNIQUE (user_id, client_order_id), so that one checkout is one
//     order even if its idempotency record is gone (expired, purged);
//     state is one of pending, paid, shipped, and moves only forward, by
//     guarded updates;
//   - products: CHECK (stock >= 0), the last line behind the guarded
//     update that takes stock;
//   - settings: the secret that signs session cookies, made once.
func schema(id string) string {
	return strings.ReplaceAll(`
CREATE TABLE IF NOT EXISTS products (
    sku         TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    price_cents BIGINT NOT NULL CHECK (price_cents > 0),
    stock       BIGINT NOT NULL CHECK (stock >= 0)
);
CREATE TABLE IF NOT EXISTS orders (
    id              {id},
    user_id         TEXT NOT NULL,
    client_order_id TEXT NOT NULL,
    sku             TEXT NOT NULL REFERENCES products (sku),
    qty             BIGINT NOT NULL CHECK (qty > 0),
    amount_cents    BIGINT NOT NULL,
    state           TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'paid', 'shipped')),
    payment_key     TEXT,
    charge_id       TEXT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    UNIQUE (user_id, client_order_id)
);
CREATE TABLE IF NOT EXISTS settings (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
`, "{id}", id)
}

// catalogue is what a new shop sells. The poster is scarce, to show that
// stock never goes below zero.
var catalogue = []product{
	{SKU: "mug", Name: "Idempotent mug", PriceCents: 1200, Stock: 100},
	{SKU: "tee", Name: "At-most-once T-shirt", PriceCents: 2500, Stock: 50},
	{SKU: "poster", Name: "Insert-first poster (limited)", PriceCents: 900, Stock: 3},
}

// migrateAndSeed creates the tables and, on a new database, the catalogue.
func migrateAndSeed(ctx context.Context, db database) error {
	if err := db.migrate(ctx); err != nil {
		return err
	}
	for _, p := range catalogue {
		if _, err := db.exec(ctx, `INSERT INTO products (sku, name, price_cents, stock) VALUES (?, ?, ?, ?)
			ON CONFLICT (sku) DO NOTHING`, p.SKU, p.Name, p.PriceCents, p.Stock); err != nil {
			return err
		}
	}
	return nil
}

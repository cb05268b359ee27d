package lab

import (
	"fmt"
	"io"
	"strings"
)

// Strategy is one way of making an operation run once per key.
type Strategy string

// The strategies the lab plays, in the order it plays them.
const (
	// CheckThenInsert reads the key and inserts it when absent, in one
	// transaction.
	CheckThenInsert Strategy = "check-then-insert"
	// SelectForUpdate reads the key with SELECT … FOR UPDATE and inserts it
	// when absent, in one transaction. On SQLite, which has no row locks,
	// the transaction starts with BEGIN IMMEDIATE instead.
	SelectForUpdate Strategy = "select-for-update"
	// InsertFirst inserts the key against a unique constraint first; the
	// one insert that succeeds wins (idem's way).
	InsertFirst Strategy = "insert-first"
)

// Strategies lists every strategy, in the order the lab plays them.
var Strategies = []Strategy{CheckThenInsert, SelectForUpdate, InsertFirst}

// Isolation is a transaction isolation level.
type Isolation string

// The isolation levels, weakest first.
const (
	ReadCommitted  Isolation = "read-committed"
	RepeatableRead Isolation = "repeatable-read"
	Serializable   Isolation = "serializable"
)

// Isolations lists every isolation level, weakest first.
var Isolations = []Isolation{ReadCommitted, RepeatableRead, Serializable}

// ParseIsolation reads an --isolation value: one level, a comma-separated
// list, or "all".
func ParseIsolation(s string) ([]Isolation, error) {
	return parseList(s, Isolations, "isolation level", "read-committed, repeatable-read, serializable or all")
}

// ParseStrategy reads a --strategy value: one strategy, a comma-separated
// list, or "all".
func ParseStrategy(s string) ([]Strategy, error) {
	return parseList(s, Strategies, "strategy", "check-then-insert, select-for-update, insert-first or all")
}

// parseList reads "all" as every value of all, or a comma-separated list
// of them, each kept once, in the order given.
func parseList[T ~string](s string, all []T, what, hint string) ([]T, error) {
	if strings.TrimSpace(s) == "all" {
		return all, nil
	}
	var out []T
	for _, part := range strings.Split(s, ",") {
		v := T(strings.TrimSpace(part))
		if !contains(all, v) {
			return nil, fmt.Errorf("unknown %s %q: use %s", what, part, hint)
		}
		if !contains(out, v) {
			out = append(out, v)
		}
	}
	return out, nil
}

func contains[T comparable](list []T, v T) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// Limits on Config, so that a typo cannot open thousands of connections or
// run for hours.
const (
	MaxConcurrency = 64
	MaxRounds      = 100_000
)

// Config says what the lab runs and where.
type Config struct {
	// Store is the database, as a store URL: postgres://…, mysql://… or
	// sqlite://PATH (see internal/storeurl). Required.
	Store string

	// Isolations are the levels to run each strategy at. Defaults to all
	// three. On SQLite, which runs every transaction serializably, the
	// weaker levels are skipped and listed in Report.Skipped.
	Isolations []Isolation

	// Strategies are the strategies to play. Defaults to all three.
	Strategies []Strategy

	// Concurrency is the number of workers racing for each key, each on a
	// connection of its own; at least 2, at most MaxConcurrency. Defaults
	// to 8.
	Concurrency int

	// Rounds is the number of keys raced for, one after the other, per
	// strategy and isolation level; at most MaxRounds. Defaults to 100.
	Rounds int

	// NoBarrier lets workers go from their check to their insert at their
	// own pace. By default every worker waits, between its check (or, for
	// insert-first, its BEGIN) and its insert, until all workers of the
	// round have reached that point, so that every round hits the
	// interleaving that production traffic hits only now and then.
	// Defaults to false.
	NoBarrier bool

	// UniqueCheckTable gives the table of check-then-insert and
	// select-for-update a unique constraint on the key, instead of a plain
	// index: duplicates then turn into unique violations that reach the
	// client as errors. Defaults to false.
	UniqueCheckTable bool

	// Progress receives one line as each strategy and level starts and
	// ends. Defaults to io.Discard.
	Progress io.Writer

	// afterRound, when set, is called after each round, and onArrive by
	// each worker as it reaches the barrier (tests cancel a run mid-way
	// with them).
	afterRound func(cell, round int)
	onArrive   func(cell, round, worker int)
	// tableBase, when set, replaces the random idem_lab_<hex> name.
	tableBase string
}

func (c Config) withDefaults() Config {
	if c.Isolations == nil {
		c.Isolations = Isolations
	}
	if c.Strategies == nil {
		c.Strategies = Strategies
	}
	if c.Concurrency == 0 {
		c.Concurrency = 8
	}
	if c.Rounds == 0 {
		c.Rounds = 100
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return c
}

func (c Config) validate() error {
	if c.Store == "" {
		return fmt.Errorf("lab: a store URL is required (postgres://…, mysql://… or sqlite://PATH)")
	}
	if c.Concurrency < 2 || c.Concurrency > MaxConcurrency {
		return fmt.Errorf("lab: concurrency must be between 2 and %d (it takes two to race), got %d", MaxConcurrency, c.Concurrency)
	}
	if c.Rounds < 1 || c.Rounds > MaxRounds {
		return fmt.Errorf("lab: rounds must be between 1 and %d, got %d", MaxRounds, c.Rounds)
	}
	if len(c.Isolations) == 0 {
		return fmt.Errorf("lab: no isolation level to run")
	}
	for _, lvl := range c.Isolations {
		if !contains(Isolations, lvl) {
			return fmt.Errorf("lab: unknown isolation level %q", lvl)
		}
	}
	if len(c.Strategies) == 0 {
		return fmt.Errorf("lab: no strategy to run")
	}
	for _, s := range c.Strategies {
		if !contains(Strategies, s) {
			return fmt.Errorf("lab: unknown strategy %q", s)
		}
	}
	return nil
}

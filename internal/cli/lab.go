package cli

import (
	"fmt"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/idem-dev/idem/internal/lab"
)

func init() { extraCommands = append(extraCommands, newLabCmd) }

type labFlags struct {
	store, isolation, strategy, format string
	concurrency, rounds                int
	noBarrier, uniqueCheckTable        bool
}

func newLabCmd() *cobra.Command {
	var f labFlags
	cmd := &cobra.Command{
		Use:   "lab --store URL [--isolation LEVEL|all] [--concurrency N] [--rounds N] [--format table|json|markdown]",
		Short: "Race three ways of running an operation once per key on a real database, and count the duplicates",
		Long: `lab shows, on your own database, why idem reserves a key by INSERT against a
unique constraint rather than by checking first. For every isolation level it
runs three strategies, each played by --concurrency workers racing for one new
key per round, --rounds times:

  check-then-insert   SELECT the key; INSERT it if absent; commit
  select-for-update   SELECT … FOR UPDATE; INSERT if absent; commit
                      (SQLite has no FOR UPDATE: BEGIN IMMEDIATE instead)
  insert-first        INSERT against the unique key; the one insert that
                      succeeds wins (idem's way)

A worker whose transaction commits with its row believes it won and runs the
operation; the lab counts those executions per key. The first two strategies
use a table with a plain index on the key and no unique constraint (what a team
that trusts its check has; --unique-check-table adds one), so their duplicates
are counted, not hidden; insert-first uses a table whose primary key is the key.

By default every worker waits at a barrier between its check and its insert
until all have checked, so that each round hits the race that production
traffic hits only now and then; --no-barrier lets them run freely.

Counted per strategy and level: rounds, the most executions of one key,
duplicate executions, deadlocks (and lock wait timeouts), serialization
failures, unique violations that reached the caller, other errors, rounds per
second; the table and markdown formats add a line saying what each row shows.

The lab works only on scratch tables it creates (idem_lab_<random>_check and
_insert) and drops them when it ends, also on an error or Ctrl-C; idem's own
tables are never touched. A sqlite:// file that did not exist is removed
afterwards. Progress goes to stderr, the results to stdout.`,
		Example: `  idem lab --store 'postgres://app@127.0.0.1:5432/app?sslmode=disable'
  idem lab --store 'mysql://root@tcp(127.0.0.1:3306)/app' --isolation repeatable-read --format json
  idem lab --store sqlite://lab.db --format markdown`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runLab(cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.store, "store", "", "the database: postgres://…, mysql://… or sqlite://PATH (required)")
	fl.StringVar(&f.isolation, "isolation", "all", "read-committed, repeatable-read, serializable, a comma-separated list, or all")
	fl.StringVar(&f.strategy, "strategy", "all", "check-then-insert, select-for-update, insert-first, a comma-separated list, or all")
	fl.IntVar(&f.concurrency, "concurrency", 8, fmt.Sprintf("workers racing for each key, each on its own connection (2 to %d)", lab.MaxConcurrency))
	fl.IntVar(&f.rounds, "rounds", 100, fmt.Sprintf("keys raced for per strategy and level (1 to %d)", lab.MaxRounds))
	fl.StringVar(&f.format, "format", "table", "table, json or markdown")
	fl.BoolVar(&f.noBarrier, "no-barrier", false, "let workers go from check to insert at their own pace (races get rarer, not impossible)")
	fl.BoolVar(&f.uniqueCheckTable, "unique-check-table", false, "give the check strategies' table a unique constraint: duplicates become errors")
	return cmd
}

func runLab(cmd *cobra.Command, f labFlags) error {
	if f.store == "" {
		return usageError{fmt.Errorf("lab needs --store: postgres://…, mysql://… or sqlite://PATH")}
	}
	switch f.format {
	case lab.FormatTable, lab.FormatJSON, lab.FormatMarkdown:
	default:
		return usageError{fmt.Errorf("--format must be table, json or markdown, got %q", f.format)}
	}
	levels, err := lab.ParseIsolation(f.isolation)
	if err != nil {
		return usageError{fmt.Errorf("--isolation: %w", err)}
	}
	strategies, err := lab.ParseStrategy(f.strategy)
	if err != nil {
		return usageError{fmt.Errorf("--strategy: %w", err)}
	}
	if f.concurrency < 2 || f.concurrency > lab.MaxConcurrency {
		return usageError{fmt.Errorf("--concurrency must be between 2 and %d, got %d", lab.MaxConcurrency, f.concurrency)}
	}
	if f.rounds < 1 || f.rounds > lab.MaxRounds {
		return usageError{fmt.Errorf("--rounds must be between 1 and %d, got %d", lab.MaxRounds, f.rounds)}
	}
	// Piped into head or less that quits early, a write to a closed pipe
	// would kill the process before it drops its tables; ignored, the write
	// fails instead and the run ends cleanly.
	signal.Ignore(syscall.SIGPIPE)
	defer signal.Reset(syscall.SIGPIPE)
	rep, err := lab.Run(cmd.Context(), lab.Config{
		Store:            f.store,
		Isolations:       levels,
		Strategies:       strategies,
		Concurrency:      f.concurrency,
		Rounds:           f.rounds,
		NoBarrier:        f.noBarrier,
		UniqueCheckTable: f.uniqueCheckTable,
		Progress:         cmd.ErrOrStderr(),
	})
	if err != nil {
		return err
	}
	return rep.Write(cmd.OutOrStdout(), f.format)
}

package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/storeurl"
)

func init() { extraCommands = append(extraCommands, newMigrateCmd, newPurgeCmd) }

func newMigrateCmd() *cobra.Command {
	var store string
	cmd := &cobra.Command{
		Use:   "migrate --store URL",
		Short: "Create or update the store's schema",
		Long: `migrate applies the store's schema migrations (SQLite, PostgreSQL, MySQL) and
exits. It is safe to run from several deploy jobs at once: the migrations take
a lock and each runs exactly once. idem serve also migrates when it starts.

Redis has no schema: there, migrate puts every record into the search indexes
(records written by versions of idem before the indexes have none, so searches and
counts miss them until it has run), printing its progress. It is idempotent
and safe while proxies serve. Memory stores have nothing to migrate.`,
		Example: `  idem migrate --store sqlite:///var/lib/idem/idem.db
  idem migrate --store 'postgres://idem:secret@db:5432/idem'
  idem migrate --store 'mysql://idem:secret@tcp(db:3306)/idem'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := storeurl.Parse(store)
			if err != nil {
				return usageError{err}
			}
			if t.Kind == storeurl.KindMemory {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s stores have no schema; nothing to migrate.\n", t.Redacted, t.Kind)
				return nil
			}
			if t.Kind == storeurl.KindRedis || t.Kind == storeurl.KindRedisCluster {
				return reindex(cmd, t)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			_, closeFn, err := t.Connect(ctx, true)
			if err != nil {
				return err
			}
			defer closeFn()
			fmt.Fprintf(cmd.OutOrStdout(), "%s: schema up to date.\n", t.Redacted)
			return nil
		},
	}
	cmd.Flags().StringVar(&store, "store", "sqlite://idem.db", "store URL")
	return cmd
}

// reindexer is a store whose search indexes can be rebuilt from its
// records (idemredis).
type reindexer interface {
	Reindex(ctx context.Context, progress func(indexed int)) (int, error)
}

// reindex puts every record of the Redis store t into its search indexes.
func reindex(cmd *cobra.Command, t *storeurl.Target) error {
	s, closeFn, err := t.Connect(cmd.Context(), false)
	if err != nil {
		return err
	}
	defer closeFn()
	r, ok := s.(reindexer)
	if !ok {
		return fmt.Errorf("%s: the store cannot rebuild its indexes", t.Redacted)
	}
	n, err := r.Reindex(cmd.Context(), func(done int) {
		fmt.Fprintf(cmd.OutOrStdout(), "indexed %d records so far\n", done)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s: search indexes up to date (%d records indexed).\n", t.Redacted, n)
	return nil
}

func newPurgeCmd() *cobra.Command {
	var (
		store string
		batch int
	)
	cmd := &cobra.Command{
		Use:   "purge --store URL [--batch N]",
		Short: "Delete completed records whose retention has ended",
		Long: `purge deletes completed records past their retention, in batches of --batch
records per statement so that no long lock is held, and prints its progress.
Pending and needs-review records are never purged. idem serve purges on its own
every few minutes; this command is for stores no proxy runs against.`,
		Example: `  idem purge --store sqlite://idem.db
  idem purge --store 'postgres://idem:secret@db:5432/idem' --batch 1000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if batch < 1 {
				return usageError{fmt.Errorf("--batch %d must be positive", batch)}
			}
			t, err := storeurl.Parse(store)
			if err != nil {
				return usageError{err}
			}
			ctx := cmd.Context()
			s, closeFn, err := t.Connect(ctx, false)
			if err != nil {
				return err
			}
			defer closeFn()
			out := cmd.OutOrStdout()
			// Progress at most once a second; Ctrl-C stops between batches.
			var last time.Time
			progress := func(deleted int) {
				if now := time.Now(); now.Sub(last) >= time.Second {
					last = now
					fmt.Fprintf(out, "purged %d records so far\n", deleted)
				}
			}
			total, err := s.Purge(ctx, idemstore.PurgeParams{BatchSize: batch, Progress: progress})
			if err != nil {
				return fmt.Errorf("purged %d records, then: %w", total, err)
			}
			fmt.Fprintf(out, "%s: purged %d expired records.\n", t.Redacted, total)
			return nil
		},
	}
	cmd.Flags().StringVar(&store, "store", "sqlite://idem.db", "store URL")
	cmd.Flags().IntVar(&batch, "batch", 500, "records deleted per statement")
	return cmd
}

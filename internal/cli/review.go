package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/idem-dev/idem/idemadmin"
)

func init() { extraCommands = append(extraCommands, newReviewCmd) }

// newReviewCmd groups the commands an operator uses on keys whose outcome
// is unknown (needs_review): an upstream that failed after the request was
// sent, a crashed holder of an external operation, a panicking handler.
func newReviewCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "review",
		Short: "List and settle keys whose outcome is unknown (needs review)",
		Long: `A key goes to review when idem cannot know whether its operation ran: the
upstream failed after the request was sent, or the process holding an external
operation died. Retries get 409 (needs-review) until the key is settled, so the
operation never runs twice by accident.

Check the outside system (the payment provider, using the same Idempotency-Key),
then settle the key: --release if the operation did not happen (the next retry
runs it), or --status with the answer retries should get if it did.

Both commands speak to a running proxy's admin API (--admin-url, with the token
of --admin-token-file or IDEM_ADMIN_TOKEN) or open the store directly
(--store); neither creates a store that does not exist. The review page at the
admin URL does the same in a browser.`,
	}
	cmd.AddCommand(newReviewListCmd(), newReviewResolveCmd(), newReviewBulkCmd())
	return cmd
}

func newReviewListCmd() *cobra.Command {
	var (
		src    keySource
		lf     listFlags
		limit  int
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list (--admin-url URL | --store URL) [--key K | --key-prefix P] [--operation OP] [--older-than D] [--reason TEXT] [--label L] [--limit N] [--json]",
		Short: "List the keys that need review, the one waiting longest first",
		Example: `  idem review list --admin-url http://127.0.0.1:9090 --admin-token-file admin.token
  idem review list --store sqlite:///var/lib/idem/idem.db --older-than 1h --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := lf.query()
			q.State = "needs_review"
			return listKeys(cmd, &src, q, limit, asJSON, "No keys need review.")
		},
	}
	src.flags(cmd.Flags())
	lf.flags(cmd.Flags(), false)
	cmd.Flags().IntVar(&limit, "limit", 100, "the most keys to list")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of keys instead of a table")
	return cmd
}

func newReviewResolveCmd() *cobra.Command {
	var (
		src          keySource
		kf           keyFlags
		af           attemptFlags
		ans          answerFlags
		note, reason string
		release      bool
	)
	cmd := &cobra.Command{
		Use:   "resolve (ID | --scope S --operation OP --key K) (--admin-url URL | --store URL) (--attempt A | --any-attempt) (--release | --status N [--body TEXT|@FILE] [--header 'Name: value']) [--note TEXT]",
		Short: "Settle a key that needs review",
		Long: `resolve settles one key that needs review (see 'idem review list' for its id
and attempt). --release deletes it, so the next retry runs the operation; use
it only when the operation certainly did not happen. --status stores an answer
that every retry gets from then on, as if the operation had completed.

--attempt is the attempt you checked with the provider (the ATTEMPT column of
'idem review list'): if the key was settled, retried and sent to review again
since, that new attempt is left alone and the command fails. --any-attempt
settles whichever attempt is in review.`,
		Example: `  idem review resolve CkBhYmM… --admin-url http://127.0.0.1:9090 --attempt 4f1c0a9e7d2b6c35 --release --note 'never reached the provider'
  idem review resolve --store sqlite://idem.db --scope 9f86d0… --operation 'POST /payments' --key order-1002 --attempt 4f1c0a9e7d2b6c35 \
      --status 201 --header 'Content-Type: application/json' --body '{"payment":"pay_77"}' --note 'charged per provider dashboard'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := kf.resolveID(args)
			if err != nil {
				return err
			}
			if release == (ans.status != 0) {
				return usageError{errors.New("give exactly one of --release and --status")}
			}
			if note != "" && reason != "" {
				return usageError{errors.New("--reason is the old name of --note; give one")}
			}
			if err := af.check(); err != nil {
				return err
			}
			req := idemadmin.ResolveRequest{Action: idemadmin.ActionRelease, Note: note + reason}
			if !release {
				req.Action = idemadmin.ActionComplete
				if req.Answer, err = ans.answer(); err != nil {
					return usageError{err}
				}
			}
			svc, closeFn, err := src.open(cmd)
			if err != nil {
				return err
			}
			defer closeFn()
			if req.Attempt, err = af.value(cmd, svc, id); err != nil {
				return err
			}
			res, err := svc.Resolve(cmd.Context(), id, req)
			if err != nil {
				return err
			}
			if release {
				fmt.Fprintf(cmd.OutOrStdout(), "Released %s (%s): the next retry runs the operation.\n", quoteKey(res.Key), idemadmin.Visible(res.Operation))
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "Completed %s (%s) with status %d: retries get this answer.\n", quoteKey(res.Key), idemadmin.Visible(res.Operation), ans.status)
			}
			return nil
		},
	}
	f := cmd.Flags()
	src.flags(f)
	kf.flags(f)
	af.flags(f)
	ans.flags(f)
	f.BoolVar(&release, "release", false, "the operation did not happen: delete the key")
	f.StringVar(&note, "note", "", "why, for the audit log and the record")
	f.StringVar(&reason, "reason", "", "the old name of --note")
	f.MarkHidden("reason")
	return cmd
}

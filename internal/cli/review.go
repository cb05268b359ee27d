package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/storeurl"
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
runs it), or --status with the answer retries should get if it did.`,
	}
	cmd.AddCommand(newReviewListCmd(), newReviewResolveCmd())
	return cmd
}

func connectStore(cmd *cobra.Command, rawURL string) (idemstore.Store, func() error, *storeurl.Target, error) {
	t, err := storeurl.Parse(rawURL)
	if err != nil {
		return nil, nil, nil, usageError{err}
	}
	s, closeFn, err := t.Connect(cmd.Context(), false)
	if err != nil {
		return nil, nil, nil, err
	}
	return s, closeFn, t, nil
}

func newReviewListCmd() *cobra.Command {
	var (
		store  string
		limit  int
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list --store URL [--limit N] [--json]",
		Short: "List the keys that need review",
		Example: `  idem review list --store sqlite://idem.db
  idem review list --store 'postgres://idem@db/idem' --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 {
				return usageError{fmt.Errorf("--limit %d must be positive", limit)}
			}
			s, closeFn, _, err := connectStore(cmd, store)
			if err != nil {
				return err
			}
			defer closeFn()
			var recs []*idemstore.Record
			cursor := ""
			for len(recs) < limit {
				page, err := s.List(cmd.Context(), idemstore.ListParams{State: idemstore.StateNeedsReview, Cursor: cursor, Limit: min(limit-len(recs), 1000)})
				if err != nil {
					return err
				}
				recs = append(recs, page.Records...)
				if cursor = page.NextCursor; cursor == "" {
					break
				}
			}
			out := cmd.OutOrStdout()
			if asJSON {
				type row struct {
					Scope     string    `json:"scope"`
					Operation string    `json:"operation"`
					Key       string    `json:"key"`
					CreatedAt time.Time `json:"created_at"`
					Reason    string    `json:"reason"`
				}
				rows := make([]row, 0, len(recs))
				for _, r := range recs {
					rows = append(rows, row{r.Key.Scope, r.Key.Operation, r.Key.Key, r.CreatedAt, r.Reason})
				}
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			if len(recs) == 0 {
				fmt.Fprintln(out, "No keys need review.")
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SCOPE\tOPERATION\tKEY\tCREATED\tREASON")
			for _, r := range recs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Key.Scope, r.Key.Operation, r.Key.Key, r.CreatedAt.Format(time.RFC3339), r.Reason)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&store, "store", "sqlite://idem.db", "store URL")
	cmd.Flags().IntVar(&limit, "limit", 100, "the most keys to list")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return cmd
}

func newReviewResolveCmd() *cobra.Command {
	var (
		store, scope, operation, key, body, reason string
		release                                    bool
		status                                     int
		headers                                    []string
		retention                                  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "resolve --store URL --scope S --operation OP --key K (--release | --status N [--body TEXT|@FILE] [--header 'Name: value'])",
		Short: "Settle a key that needs review",
		Long: `resolve settles one key that needs review (see 'idem review list' for the scope,
operation and key). --release deletes it, so the next retry runs the operation;
use it only when the operation certainly did not happen. --status stores an
answer that every retry gets from then on, as if the operation had completed.`,
		Example: `  idem review resolve --store sqlite://idem.db --scope 9f86d0… --operation 'POST /payments' --key order-1002 --release
  idem review resolve --store sqlite://idem.db --scope 9f86d0… --operation 'POST /payments' --key order-1002 \
      --status 201 --header 'Content-Type: application/json' --body '{"payment":"pay_77"}' --reason 'charged per provider dashboard'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if scope == "" || operation == "" || key == "" {
				return usageError{fmt.Errorf("--scope, --operation and --key are required")}
			}
			if release == (status != 0) {
				return usageError{fmt.Errorf("give exactly one of --release and --status")}
			}
			p := idemstore.ResolveParams{
				Key:    idemstore.Key{Scope: scope, Operation: operation, Key: key},
				Action: idemstore.ResolveRelease,
				Reason: reason,
			}
			if !release {
				if status < 100 || status > 599 {
					return usageError{fmt.Errorf("--status %d is not an HTTP status", status)}
				}
				resp := &idemstore.Response{Status: status, Header: http.Header{}, Body: []byte(body)}
				if strings.HasPrefix(body, "@") {
					b, err := os.ReadFile(body[1:])
					if err != nil {
						return usageError{err}
					}
					resp.Body = b
				}
				for _, h := range headers {
					name, value, ok := strings.Cut(h, ":")
					if !ok || strings.TrimSpace(name) == "" {
						return usageError{fmt.Errorf("--header %q is not 'Name: value'", h)}
					}
					resp.Header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
				}
				p.Action, p.Response, p.Retention = idemstore.ResolveComplete, resp, retention
			}
			s, closeFn, t, err := connectStore(cmd, store)
			if err != nil {
				return err
			}
			defer closeFn()
			if err := s.Resolve(cmd.Context(), p); err != nil {
				return fmt.Errorf("%s: %w", t.Redacted, err)
			}
			if release {
				fmt.Fprintf(cmd.OutOrStdout(), "Released %q: the next retry runs the operation.\n", key)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "Completed %q with status %d: retries get this answer.\n", key, status)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&store, "store", "sqlite://idem.db", "store URL")
	f.StringVar(&scope, "scope", "", "the key's scope, as 'idem review list' shows it")
	f.StringVar(&operation, "operation", "", "the key's operation, e.g. 'POST /payments'")
	f.StringVar(&key, "key", "", "the Idempotency-Key")
	f.BoolVar(&release, "release", false, "the operation did not happen: delete the key")
	f.IntVar(&status, "status", 0, "the operation happened: store this status for retries")
	f.StringVar(&body, "body", "", "the stored answer's body, or @FILE")
	f.StringArrayVar(&headers, "header", nil, "a stored answer header, 'Name: value' (repeatable)")
	f.StringVar(&reason, "reason", "", "why, for the record")
	f.DurationVar(&retention, "retention", 24*time.Hour, "how long the stored answer is kept")
	return cmd
}

package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/idem-dev/idem/idemadmin"
)

// bulkService is a keyService that settles many keys at once.
type bulkService interface {
	Bulk(ctx context.Context, req idemadmin.BulkRequest) (idemadmin.BulkResult, error)
}

func (s storeKeys) Bulk(ctx context.Context, req idemadmin.BulkRequest) (idemadmin.BulkResult, error) {
	return s.keys.Bulk(ctx, s.who, req)
}

func newReviewBulkCmd() *cobra.Command {
	var (
		src     keySource
		ans     answerFlags
		from    string
		note    string
		release bool
		yes     bool
		asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "bulk (ID:ATTEMPT… | --from FILE) (--admin-url URL | --store URL) (--release | --status N [--body TEXT|@FILE] [--header 'Name: value']) [--note TEXT] [--yes]",
		Short: "Settle many keys that need review at once, each at the attempt you looked at",
		Long: fmt.Sprintf(`bulk settles up to %d keys in review with one action: --release (none of the
operations happened) or --status with the one answer every retry of every key
gets (all of them happened).

Name each key with the attempt you checked, as ID:ATTEMPT (the ID and ATTEMPT
columns of 'idem review list'), or give --from a file written by
'idem review list --json' (its id and attempt of each key; - reads standard
input). A key that is no longer in review, or holds another attempt by then,
is skipped and reported, never settled; the others go on.

Without --yes, bulk only lists what it would do and exits 2: read the list,
then run it again with --yes. It exits 1 when any key was skipped.`, idemadmin.MaxBulkKeys),
		Example: `  idem review list --admin-url http://127.0.0.1:9090 --operation 'POST /payments' --json > stuck.json
  idem review bulk --from stuck.json --admin-url http://127.0.0.1:9090 --release --note 'provider has none of them'
  idem review bulk --from stuck.json --admin-url http://127.0.0.1:9090 --release --note 'provider has none of them' --yes
  idem review bulk CkBhYmM…:4f1c0a9e7d2b6c35 CkBhYmN…:9b0e55d1c2a47f18 --store sqlite://idem.db \
      --status 201 --header 'Content-Type: application/json' --body '{"status":"charged"}' --yes`,
		RunE: func(cmd *cobra.Command, args []string) error {
			keys, err := bulkKeys(cmd.InOrStdin(), args, from)
			if err != nil {
				return usageError{err}
			}
			if release == (ans.status != 0) {
				return usageError{errors.New("give exactly one of --release and --status")}
			}
			req := idemadmin.BulkRequest{Action: idemadmin.ActionRelease, Keys: keys, Note: note}
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
			bs, ok := svc.(bulkService)
			if !ok {
				return errors.New("this key source cannot settle keys in bulk")
			}
			out := cmd.OutOrStdout()
			if !yes {
				if err := printBulkPlan(cmd.Context(), out, svc, req); err != nil {
					return err
				}
				return usageError{fmt.Errorf("nothing was changed: run again with --yes to %s these %d keys", req.Action, len(keys))}
			}
			res, err := bs.Bulk(cmd.Context(), req)
			if err != nil {
				return err
			}
			if asJSON {
				if err := writeJSON(out, res); err != nil {
					return err
				}
			} else {
				printBulkResult(out, res)
			}
			if res.Skipped > 0 {
				return fmt.Errorf("%d of %d keys skipped (see the list); the others were settled", res.Skipped, len(keys))
			}
			return nil
		},
	}
	f := cmd.Flags()
	src.flags(f)
	ans.flags(f)
	f.StringVar(&from, "from", "", "read the keys from this file of 'idem review list --json' (- for standard input)")
	f.BoolVar(&release, "release", false, "none of the operations happened: delete the keys")
	f.StringVar(&note, "note", "", "why, for the audit log and the records")
	f.BoolVar(&yes, "yes", false, "do it (without it, bulk only lists what it would do)")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

// bulkKeys reads the keys of a bulk action: ID:ATTEMPT arguments, or the
// items of a --json listing.
func bulkKeys(stdin io.Reader, args []string, from string) ([]idemadmin.BulkKey, error) {
	var keys []idemadmin.BulkKey
	switch {
	case from != "" && len(args) > 0:
		return nil, errors.New("give the keys as arguments or with --from, not both")
	case from != "":
		var b []byte
		var err error
		if from == "-" {
			b, err = io.ReadAll(io.LimitReader(stdin, 64<<20))
		} else {
			b, err = os.ReadFile(from)
		}
		if err != nil {
			return nil, err
		}
		var items []idemadmin.Item
		if err := json.Unmarshal(b, &items); err != nil {
			return nil, fmt.Errorf("--from %s: not the JSON of 'idem review list --json': %v", from, err)
		}
		for i, it := range items {
			if it.ID == "" || it.Attempt == "" {
				return nil, fmt.Errorf("--from %s: item %d has no id or attempt", from, i+1)
			}
			keys = append(keys, idemadmin.BulkKey{ID: it.ID, Attempt: it.Attempt})
		}
	default:
		for _, a := range args {
			id, attempt, ok := strings.Cut(a, ":")
			if !ok || id == "" || attempt == "" {
				return nil, fmt.Errorf("%q is not ID:ATTEMPT (the ID and ATTEMPT columns of 'idem review list')", cutText(a, 80))
			}
			keys = append(keys, idemadmin.BulkKey{ID: id, Attempt: attempt})
		}
	}
	switch {
	case len(keys) == 0:
		return nil, errors.New("name the keys to settle: ID:ATTEMPT arguments, or --from FILE")
	case len(keys) > idemadmin.MaxBulkKeys:
		return nil, fmt.Errorf("%d keys; at most %d in one bulk action", len(keys), idemadmin.MaxBulkKeys)
	}
	return keys, nil
}

// printBulkPlan lists what a bulk action would do, key by key, as each
// key is now.
func printBulkPlan(ctx context.Context, w io.Writer, svc keyService, req idemadmin.BulkRequest) error {
	verb := "Release"
	if req.Action == idemadmin.ActionComplete {
		verb = fmt.Sprintf("Complete with status %d", req.Status)
	}
	fmt.Fprintf(w, "%s these %d keys:\n", verb, len(req.Keys))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tREQUEST\tATTEMPT\tNOW")
	for _, k := range req.Keys {
		it, err := svc.Get(ctx, k.ID)
		switch {
		case err != nil:
			fmt.Fprintf(tw, "?\t?\t%s\twill be skipped: %s\n", idemadmin.Visible(k.Attempt), idemadmin.Visible(cutText(err.Error(), 100)))
		case it.State != "needs_review":
			fmt.Fprintf(tw, "%s\t%s\t%s\twill be skipped: it is %s\n", idemadmin.Visible(it.Key), requestLine(it), idemadmin.Visible(k.Attempt), it.State)
		case it.Attempt != k.Attempt:
			fmt.Fprintf(tw, "%s\t%s\t%s\twill be skipped: attempt %s holds it now\n", idemadmin.Visible(it.Key), requestLine(it), idemadmin.Visible(k.Attempt), it.Attempt)
		default:
			fmt.Fprintf(tw, "%s\t%s\t%s\tin review for %s\n", idemadmin.Visible(it.Key), requestLine(it), it.Attempt, idemadmin.HumanDuration(it.Age()))
		}
	}
	return tw.Flush()
}

func printBulkResult(w io.Writer, res idemadmin.BulkResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tOPERATION\tATTEMPT\tOUTCOME\tDETAIL")
	for _, it := range res.Results {
		outcome := it.Outcome
		if outcome == idemadmin.OutcomeSettled {
			outcome = it.State
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", idemadmin.Visible(it.Key), idemadmin.Visible(it.Operation), idemadmin.Visible(it.Attempt),
			outcome, idemadmin.Visible(cutText(it.Detail, 160)))
	}
	tw.Flush()
	fmt.Fprintf(w, "%d settled, %d skipped.\n", res.Settled, res.Skipped)
}

// answerFlags are the answer an operator stores: --status, --header,
// --body.
type answerFlags struct {
	status  int
	body    string
	headers []string
}

func (a *answerFlags) flags(f interface {
	IntVar(*int, string, int, string)
	StringVar(*string, string, string, string)
	StringArrayVar(*[]string, string, []string, string)
}) {
	f.IntVar(&a.status, "status", 0, "the operation happened: store this status for retries")
	f.StringVar(&a.body, "body", "", "the stored answer's body, or @FILE")
	f.StringArrayVar(&a.headers, "header", nil, "a stored answer header, 'Name: value' (repeatable)")
}

// answer returns the answer the flags give, checked.
func (a *answerFlags) answer() (idemadmin.Answer, error) {
	ans := idemadmin.Answer{Status: a.status}
	b := a.body
	if strings.HasPrefix(b, "@") {
		raw, err := os.ReadFile(b[1:])
		if err != nil {
			return ans, err
		}
		b = string(raw)
	}
	ans.Body = &b
	for _, h := range a.headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return ans, fmt.Errorf("--header %q is not 'Name: value'", h)
		}
		if ans.Headers == nil {
			ans.Headers = map[string]idemadmin.HeaderValues{}
		}
		name = strings.TrimSpace(name)
		ans.Headers[name] = append(ans.Headers[name], strings.TrimSpace(value))
	}
	if _, err := (idemadmin.ResolveRequest{Action: idemadmin.ActionComplete, Answer: ans}).Check(); err != nil {
		return ans, err
	}
	return ans, nil
}

package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/idem-dev/idem/idemadmin"
)

func init() { extraCommands = append(extraCommands, newKeysCmd) }

// newKeysCmd groups the commands that inspect keys in any state, and
// delete completed ones.
func newKeysCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "List, inspect and delete idempotency keys",
		Long: `keys reads the keys of a running proxy through its admin API (--admin-url, with
the token of --admin-token-file or IDEM_ADMIN_TOKEN), or of a store opened
directly (--store). Neither creates a store: a SQLite file that does not exist
is an error.

Keys that need review are settled with 'idem review resolve'.`,
	}
	cmd.AddCommand(newKeysListCmd(), newKeysGetCmd(), newKeysDeleteCmd(), newKeysCountsCmd())
	return cmd
}

func newKeysListCmd() *cobra.Command {
	var (
		src    keySource
		lf     listFlags
		limit  int
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list (--admin-url URL | --store URL) [--key K | --key-prefix P] [--state S] [--operation OP] [--older-than D] [--reason TEXT] [--label L] [--order O] [--limit N] [--json]",
		Short: "List keys, oldest first, or find one by its value",
		Long: `list prints keys oldest first, with a short id that every command takes in
place of the id (the key, '~' and six hex digits), the scope label, the
request, the state, its age and the reason.

--key finds a key by the value the client sent, in every scope and operation:
support has the Idempotency-Key, never the scope. --key-prefix finds the keys
starting with a value. --state, --operation, --older-than, --reason (part of
it, any case) and --label (exactly) narrow what is listed. Searching needs a
store that can (SQLite, PostgreSQL, MySQL, memory).`,
		Example: `  idem keys list --admin-url http://127.0.0.1:9090 --admin-token-file admin.token --key order-1001
  idem keys list --store sqlite:///var/lib/idem/idem.db --state needs_review --older-than 1h --reason timeout
  idem keys list --store sqlite:///var/lib/idem/idem.db --label acct_8842 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return listKeys(cmd, &src, lf.query(), limit, asJSON, "No keys.")
		},
	}
	src.flags(cmd.Flags())
	lf.flags(cmd.Flags(), true)
	cmd.Flags().IntVar(&limit, "limit", 100, "the most keys to list")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of keys instead of a table")
	return cmd
}

// listFlags are the filters of a listing.
type listFlags struct {
	state, operation, key, keyPrefix, reason, label, order string
	olderThan                                              time.Duration
}

func (l *listFlags) flags(fl *pflag.FlagSet, state bool) {
	if state {
		fl.StringVar(&l.state, "state", "", "needs_review, pending or completed (default: every state)")
	}
	fl.StringVar(&l.operation, "operation", "", "only this operation, e.g. 'POST /payments'")
	fl.StringVar(&l.key, "key", "", "only keys of exactly this value (the Idempotency-Key), in every scope and operation")
	fl.StringVar(&l.keyPrefix, "key-prefix", "", "only keys whose value starts with this")
	fl.DurationVar(&l.olderThan, "older-than", 0, "only keys created at least this long ago, e.g. 30m or 48h")
	fl.StringVar(&l.reason, "reason", "", "only keys whose reason contains this, in any case")
	fl.StringVar(&l.label, "label", "", "only keys whose scope label is exactly this")
	fl.StringVar(&l.order, "order", "", "oldest (created first, first; the default), newest, or key")
}

func (l *listFlags) query() idemadmin.ListQuery {
	return idemadmin.ListQuery{State: l.state, Operation: l.operation, Key: l.key, KeyPrefix: l.keyPrefix,
		OlderThan: l.olderThan, Reason: l.reason, Label: l.label, Order: l.order}
}

// listKeys pages through keys up to limit and prints them.
func listKeys(cmd *cobra.Command, src *keySource, q idemadmin.ListQuery, limit int, asJSON bool, none string) error {
	if limit < 1 {
		return usageError{fmt.Errorf("--limit %d must be positive", limit)}
	}
	switch q.State {
	case "", "needs_review", "pending", "completed":
	default:
		return usageError{fmt.Errorf("--state %q must be needs_review, pending or completed", q.State)}
	}
	asked := q.Order != ""
	switch q.Order {
	case "":
		q.Order = "oldest"
	case "oldest", "newest", "key":
	default:
		return usageError{fmt.Errorf("--order %q must be oldest, newest or key", q.Order)}
	}
	if q.OlderThan < 0 {
		return usageError{fmt.Errorf("--older-than %v is negative", q.OlderThan)}
	}
	svc, closeFn, err := src.open(cmd)
	if err != nil {
		return err
	}
	defer closeFn()
	items := []idemadmin.Item{}
	for len(items) < limit {
		q.Limit = min(limit-len(items), 1000)
		page, err := svc.List(cmd.Context(), q)
		var e *idemadmin.Error
		if !asked && q.Order != "key" && errors.As(err, &e) && e.Code == idemadmin.CodeNotSupported && !searches(q) {
			// A store that cannot list by age lists in key order.
			fmt.Fprintln(cmd.ErrOrStderr(), "(this store cannot list keys by age: they are in key order)")
			q.Order = "key"
			page, err = svc.List(cmd.Context(), q)
		}
		if err != nil {
			return err
		}
		items = append(items, page.Items...)
		if q.Cursor = page.NextCursor; q.Cursor == "" {
			break
		}
	}
	out := cmd.OutOrStdout()
	if asJSON {
		return writeJSON(out, items)
	}
	if len(items) == 0 {
		fmt.Fprintln(out, none)
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tLABEL\tREQUEST\tSTATE\tAGE\tREASON\tATTEMPT")
	for _, it := range items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", idemadmin.Visible(it.ShortID), orDash(idemadmin.Visible(cutText(it.ScopeLabel, 40))),
			requestLine(it), it.State, idemadmin.HumanDuration(it.Age()), idemadmin.Visible(cutText(it.Reason, 72)), idemadmin.Visible(it.Attempt))
	}
	if q.Cursor != "" {
		fmt.Fprintf(tw, "(more keys: raise --limit)\n")
	}
	return tw.Flush()
}

// searches reports whether q asks for more than a state and an operation.
func searches(q idemadmin.ListQuery) bool {
	return q.Key != "" || q.KeyPrefix != "" || q.OlderThan != 0 || q.Reason != "" || q.Label != ""
}

func newKeysCountsCmd() *cobra.Command {
	var (
		src    keySource
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "counts (--admin-url URL | --store URL) [--json]",
		Short: "Count keys by state and operation, and show the one waiting longest in review",
		Example: `  idem keys counts --admin-url http://127.0.0.1:9090 --admin-token-file admin.token
  idem keys counts --store 'postgres://idem:secret@db:5432/idem' --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			svc, closeFn, err := src.open(cmd)
			if err != nil {
				return err
			}
			defer closeFn()
			c, err := svc.Counts(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), c)
			}
			printCounts(cmd.OutOrStdout(), c)
			return nil
		},
	}
	src.flags(cmd.Flags())
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// printCounts writes an overview of the keys for a person.
func printCounts(w io.Writer, c idemadmin.Counts) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	review := strconv.FormatInt(c.NeedsReview, 10)
	if it := c.OldestNeedsReview; it != nil {
		review += fmt.Sprintf("  (longest: %s, %s in review)", idemadmin.Visible(it.ShortID), idemadmin.HumanDuration(it.Age()))
	}
	completed := strconv.FormatInt(c.Completed, 10)
	if c.CompletedEstimated {
		completed = "about " + completed + " (an estimate from the store's statistics)"
	}
	fmt.Fprintf(tw, "needs_review\t%s\npending\t%d\ncompleted\t%s\n", review, c.Pending, completed)
	if len(c.Operations) > 0 {
		fmt.Fprintf(tw, "\nOPERATION\tPENDING\tNEEDS_REVIEW\n")
		for _, o := range c.Operations {
			fmt.Fprintf(tw, "%s\t%d\t%d\n", idemadmin.Visible(o.Operation), o.Pending, o.NeedsReview)
		}
	}
	tw.Flush()
}

// orDash is s, or "-" when it is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// requestLine is what was asked: method, path and query, printable.
func requestLine(it idemadmin.Item) string {
	if it.Request == nil {
		return idemadmin.Visible(it.Operation)
	}
	s := it.Request.Method + " " + it.Request.Path
	if it.Request.Query != "" {
		s += "?" + it.Request.Query
	}
	return idemadmin.Visible(s)
}

func newKeysGetCmd() *cobra.Command {
	var (
		src    keySource
		kf     keyFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "get (ID | --scope S --operation OP --key K) (--admin-url URL | --store URL) [--json]",
		Short: "Show one key: what was asked, its state, its stored answer",
		Example: `  idem keys get CkBhYmM… --admin-url http://127.0.0.1:9090
  idem keys get --store sqlite://idem.db --scope anonymous --operation 'POST /payments' --key order-1`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := kf.resolveID(args)
			if err != nil {
				return err
			}
			svc, closeFn, err := src.open(cmd)
			if err != nil {
				return err
			}
			defer closeFn()
			it, err := svc.Get(cmd.Context(), id)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), it)
			}
			printItem(cmd.OutOrStdout(), it)
			return nil
		},
	}
	src.flags(cmd.Flags())
	kf.flags(cmd.Flags())
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// printItem writes one key for a person, every field printable.
func printItem(w io.Writer, it idemadmin.Item) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	v := idemadmin.Visible
	row := func(name, value string) { fmt.Fprintf(tw, "%s\t%s\n", name, value) }
	row("key", v(it.Key))
	state := it.State
	if it.State == "needs_review" {
		state += " for " + idemadmin.HumanDuration(it.Age())
	}
	row("state", state)
	row("request", requestLine(it))
	row("operation", v(it.Operation))
	row("scope", v(it.Scope))
	row("scope label", orDash(v(it.ScopeLabel)))
	row("reason", v(it.Reason))
	row("created", stamp(it.CreatedAt))
	row("last change", stamp(it.UpdatedAt))
	if !it.LeaseUntil.IsZero() {
		row("lease until", stamp(it.LeaseUntil))
	}
	if !it.ExpiresAt.IsZero() {
		row("kept until", stamp(it.ExpiresAt))
	}
	row("fingerprint", v(it.Fingerprint))
	row("attempt", v(it.Attempt))
	row("short id", v(it.ShortID))
	row("id", it.ID)
	if it.Sealed != "" {
		row("not opened", v(it.Sealed))
	}
	tw.Flush()
	if it.Request != nil {
		switch {
		case it.Request.Body != nil:
			fmt.Fprintf(w, "\nrequest body (%d bytes):\n%s\n", it.Request.BodyBytes, printableBody(*it.Request.Body))
		case it.Request.BodyBase64 != "":
			fmt.Fprintf(w, "\nrequest body (%d bytes, base64):\n%s\n", it.Request.BodyBytes, it.Request.BodyBase64)
		default:
			fmt.Fprintf(w, "\nrequest body: not kept (routes keep it with store_request: true)\n")
		}
	}
	if r := it.Response; r != nil {
		fmt.Fprintf(w, "\nstored answer: %d %s\n", r.Status, http.StatusText(r.Status))
		names := make([]string, 0, len(r.Headers))
		for name := range r.Headers {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			for _, val := range r.Headers[name] {
				fmt.Fprintf(w, "%s: %s\n", v(name), v(val))
			}
		}
		switch {
		case r.NotReplayable != "":
			fmt.Fprintf(w, "(not replayable: %s)\n", r.NotReplayable)
		case r.Body != nil:
			fmt.Fprintf(w, "\n%s\n", printableBody(*r.Body))
		case r.BodyBase64 != "":
			fmt.Fprintf(w, "\n(%d bytes, base64) %s\n", r.BodyBytes, r.BodyBase64)
		}
	}
}

// printableBody keeps a body's line breaks and escapes every other
// control character.
func printableBody(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = idemadmin.Visible(l)
	}
	return strings.Join(lines, "\n")
}

func newKeysDeleteCmd() *cobra.Command {
	var (
		src  keySource
		kf   keyFlags
		af   attemptFlags
		note string
	)
	cmd := &cobra.Command{
		Use:   "delete (ID | --scope S --operation OP --key K) (--admin-url URL | --store URL) (--attempt A | --any-attempt) [--note TEXT]",
		Short: "Delete a completed key, so that the next request with it runs again",
		Long: `delete removes a completed key before its retention ends: its stored answer is
forgotten, and the next request with the key runs the operation again. Keys
that are pending or need review cannot be deleted (settle those with
'idem review resolve').

--attempt is the attempt of the answer you looked at ('idem keys get' shows
it): if that answer was deleted or expired and the operation ran again since,
the new answer is left alone and the command fails. --any-attempt deletes
whichever answer is stored.`,
		Example: `  idem keys delete CkBhYmM… --admin-url http://127.0.0.1:9090 --attempt 4f1c0a9e7d2b6c35 --note 'customer asked to pay again'`,
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := kf.resolveID(args)
			if err != nil {
				return err
			}
			if err := af.check(); err != nil {
				return err
			}
			svc, closeFn, err := src.open(cmd)
			if err != nil {
				return err
			}
			defer closeFn()
			attempt, err := af.value(cmd, svc, id)
			if err != nil {
				return err
			}
			res, err := svc.Delete(cmd.Context(), id, idemadmin.DeleteRequest{Note: note, Attempt: attempt})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Deleted %s (%s): the next request with it runs the operation.\n", quoteKey(res.Key), idemadmin.Visible(res.Operation))
			return nil
		},
	}
	src.flags(cmd.Flags())
	kf.flags(cmd.Flags())
	af.flags(cmd.Flags())
	cmd.Flags().StringVar(&note, "note", "", "why, for the audit log")
	return cmd
}

// attemptFlags say which attempt of a key a change is about: the one the
// operator looked at (--attempt), or whichever holds the key
// (--any-attempt).
type attemptFlags struct {
	attempt string
	any     bool
}

func (a *attemptFlags) flags(fl *pflag.FlagSet) {
	fl.StringVar(&a.attempt, "attempt", "", "the attempt of the key you looked at ('idem keys get', or the ATTEMPT column of a listing); the change is refused if the key changed since")
	fl.BoolVar(&a.any, "any-attempt", false, "change whichever attempt holds the key, without checking that it is the one you looked at")
}

// check refuses both flags at once.
func (a *attemptFlags) check() error {
	if a.attempt != "" && a.any {
		return usageError{errors.New("give --attempt or --any-attempt, not both")}
	}
	return nil
}

// value returns the attempt to send. Without either flag it reads the
// key and fails, saying which attempt holds it now: the change is made
// only once the operator names the attempt it is about.
func (a *attemptFlags) value(cmd *cobra.Command, svc keyService, id string) (string, error) {
	switch {
	case a.any:
		return idemadmin.AnyAttempt, nil
	case a.attempt != "":
		return a.attempt, nil
	}
	it, err := svc.Get(cmd.Context(), id)
	if err != nil {
		return "", err
	}
	return "", usageError{fmt.Errorf("say which attempt of %s this is about: --attempt %s is the attempt that holds it now (%s, %s, since %s); "+
		"give it if that is the one you looked at, or --any-attempt", quoteKey(it.Key), idemadmin.Visible(it.Attempt), it.State,
		idemadmin.Visible(cutText(it.Reason, 72)), stamp(it.UpdatedAt))}
}

func quoteKey(k string) string { return fmt.Sprintf("key %q", k) }

func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xc0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// writeJSON prints v as indented JSON in which no character a terminal
// would act on appears raw (idemadmin.VisibleJSON).
func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(idemadmin.VisibleJSON(b), '\n'))
	return err
}

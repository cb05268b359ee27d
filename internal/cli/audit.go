package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/idem-dev/idem/internal/audit"
)

func init() { extraCommands = append(extraCommands, newAuditCmd) }

func newAuditCmd() *cobra.Command {
	var (
		file, format, fixOut, retention string
		lim                             audit.Options
	)
	cmd := &cobra.Command{
		Use:   "audit --openapi FILE [--format table|json|markdown] [--fix OUT]",
		Short: "Find the operations of an OpenAPI document that need an Idempotency-Key",
		Long: `audit reads an OpenAPI 3.0 or 3.1 document (YAML or JSON) and gives every
operation a verdict:

  protected             declares an Idempotency-Key header parameter (whether it
                        is required is reported), and whether the document says
                        how long keys are kept and documents 400, 409 and 422, as
                        the IETF draft asks (severity low when it does not)
  missing_key           POST, PATCH or another method that is not idempotent,
                        without the header: severity high when its path,
                        operationId, summary or tags suggest money or messages
                        (pay, charge, order, checkout, transfer, refund, email,
                        send, invite, signup, account, points), medium otherwise
  idempotent_by_method  GET, HEAD, OPTIONS, TRACE; PUT and DELETE too, which are
                        idempotent if they overwrite or delete by ID (info)

How long keys are kept is read from the x-idempotency-key-retention extension
(on the parameter, operation, path or document) or from a sentence about
expiry or retention in the parameter's, operation's or info description.
An operation that is safe to repeat without a key (a PATCH that only
overwrites settings) says so with x-idem-ignore: <reason>; its missing_key
is then only info.

--fix OUT writes a copy of the document, in the input's format, with the
Idempotency-Key parameter and the 400/409/422 problem+json answers added where
they are missing (as components, by $ref), and x-idempotency-key-retention
(--retention) where the document says nothing. The report and the exit
status are then those of the copy, audited as written (run without --fix for
the input's). OUT "-" is standard output (the report then goes to standard
error); the input itself is never overwritten.

Remote $refs are refused (audit never uses the network); $refs to local files
are followed inside the document's directory.

What a document may hold is bounded by what it expands to, not only by its
size: --max-nodes counts the nodes of the document and the files it refers
to (mapping keys included, and every YAML alias expanded), --max-depth how
deeply they nest.

Exit status: 0 clean, 1 when any missing_key is high, 2 when the document
cannot be read or fixed, or the command line is wrong.`,
		Example: `  idem audit --openapi openapi.yaml
  idem audit --openapi openapi.json --format json | jq '.[] | select(.verdict == "missing_key")'
  idem audit --openapi openapi.yaml --fix openapi.fixed.yaml --retention 48h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAudit(cmd, file, format, fixOut, retention, lim)
		},
	}
	f := cmd.Flags()
	f.StringVar(&file, "openapi", "", "the OpenAPI 3.0 or 3.1 document to audit (YAML or JSON; - for standard input)")
	f.StringVar(&format, "format", "table", "table, json or markdown")
	f.StringVar(&fixOut, "fix", "", "write a fixed copy of the document to this file (- for standard output)")
	f.StringVar(&retention, "retention", audit.DefaultRetention, "with --fix: how long the server keeps keys, written where the document says nothing")
	f.Int64Var(&lim.MaxBytes, "max-bytes", audit.DefaultMaxBytes, "refuse documents (and files they $ref) larger than this")
	f.Int64Var(&lim.MaxNodes, "max-nodes", audit.DefaultMaxNodes, "refuse documents whose nodes, with the files they $ref and every YAML alias expanded, are more than this")
	f.IntVar(&lim.MaxDepth, "max-depth", audit.DefaultMaxDepth, "refuse documents nested deeper than this")
	return cmd
}

func runAudit(cmd *cobra.Command, file, format, fixOut, retention string, lim audit.Options) error {
	if file == "" {
		return usageError{errors.New("--openapi FILE is required")}
	}
	var write func(io.Writer, []audit.Finding) error
	switch format {
	case "table":
		write = audit.WriteTable
	case "json":
		write = audit.WriteJSON
	case "markdown", "md":
		write = audit.WriteMarkdown
	default:
		return usageError{fmt.Errorf("--format %q must be table, json or markdown", format)}
	}
	switch {
	case lim.MaxBytes <= 0:
		return usageError{fmt.Errorf("--max-bytes %d must be positive", lim.MaxBytes)}
	case lim.MaxNodes <= 0:
		return usageError{fmt.Errorf("--max-nodes %d must be positive", lim.MaxNodes)}
	case lim.MaxDepth <= 0:
		return usageError{fmt.Errorf("--max-depth %d must be positive", lim.MaxDepth)}
	}
	if fixOut != "" && fixOut != "-" && file != "-" && samePath(file, fixOut) {
		return usageError{fmt.Errorf("--fix %s would overwrite the input; write the copy elsewhere and review it", fixOut)}
	}
	if file == "-" && fixOut == "-" {
		return usageError{errors.New("--openapi - and --fix - both use standard streams; write the copy to a file")}
	}
	var doc *audit.Document
	var err error
	if file == "-" {
		var data []byte
		data, err = io.ReadAll(io.LimitReader(cmd.InOrStdin(), lim.MaxBytes+1))
		if err == nil {
			doc, err = audit.Parse(cmd.Context(), data, "standard input", lim)
		}
	} else {
		doc, err = audit.Load(cmd.Context(), file, lim)
	}
	if err != nil {
		return usageError{err}
	}
	fs, err := doc.Audit()
	if err != nil {
		return usageError{fmt.Errorf("%s: %w", file, err)}
	}
	report := cmd.OutOrStdout()
	if fixOut == "-" {
		report = cmd.ErrOrStderr()
	}
	if fixOut != "" {
		// The report and the exit status are the copy's: what was written.
		out, changed, fixed, err := doc.FixAudit(cmd.Context(), audit.FixOptions{Retention: retention})
		if err != nil {
			if werr := write(report, fs); werr != nil {
				return werr
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "idem audit: the report is of the input, %s; no fixed copy was written\n", displayIn(file))
			return usageError{err}
		}
		if fixOut == "-" {
			if _, err := cmd.OutOrStdout().Write(out); err != nil {
				return err
			}
		} else if err := writeFileAtomic(fixOut, out); err != nil {
			return err
		}
		fs = fixed
		if err := write(report, fs); err != nil {
			return err
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "idem audit: wrote a fixed copy to %s (%d operations changed); the report is of the copy (run without --fix for the input's)\n",
			displayOut(fixOut), changed)
	} else if err := write(report, fs); err != nil {
		return err
	}
	if audit.Failed(fs) {
		// Exit status 1: an operation that suggests money or messages
		// has no key.
		n := 0
		for _, f := range fs {
			if f.Verdict == audit.MissingKey && f.Severity == audit.High {
				n++
			}
		}
		return fmt.Errorf("%d operation(s) that suggest money or messages declare no Idempotency-Key (missing_key, high)", n)
	}
	return nil
}

// samePath reports whether two names are the same file (or would be).
func samePath(a, b string) bool {
	ai, aerr := os.Stat(a)
	bi, berr := os.Stat(b)
	if aerr == nil && berr == nil {
		return os.SameFile(ai, bi)
	}
	aa, err1 := filepath.Abs(a)
	ba, err2 := filepath.Abs(b)
	return err1 == nil && err2 == nil && aa == ba
}

func displayIn(p string) string {
	if p == "-" {
		return "standard input"
	}
	return p
}

func displayOut(p string) string {
	if p == "-" {
		return "standard output"
	}
	return p
}

// writeFileAtomic writes data to a temporary file beside path and renames
// it into place, so a failed write leaves no half-written document.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename, a no-op
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

package audit

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
)

// WriteJSON writes the findings as a JSON list.
func WriteJSON(w io.Writer, fs []Finding) error {
	if fs == nil {
		fs = []Finding{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(fs)
}

// WriteTable writes the findings as an aligned table with a summary line.
func WriteTable(w io.Writer, fs []Finding) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "METHOD\tPATH\tOPERATION\tVERDICT\tSEVERITY\tREASONS")
	for _, f := range fs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", printable(f.Method), printable(f.Path), printable(dash(f.OperationID)), f.Verdict, f.Severity, printable(strings.Join(f.Reasons, "; ")))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, Summary(fs))
	return err
}

// WriteMarkdown writes the findings as a Markdown table with a summary
// line, for a pull request comment or a job summary.
func WriteMarkdown(w io.Writer, fs []Finding) error {
	var b strings.Builder
	b.WriteString("| Method | Path | Operation | Verdict | Severity | Reasons |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	for _, f := range fs {
		fmt.Fprintf(&b, "| %s | `%s` | %s | %s | %s | %s |\n", mdEscape(f.Method), strings.NewReplacer("`", "'", "|", `\|`).Replace(printable(f.Path)), mdEscape(dash(f.OperationID)), f.Verdict, f.Severity, mdEscape(strings.Join(f.Reasons, "; ")))
	}
	b.WriteString("\n" + Summary(fs) + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// Summary counts the findings in one line.
func Summary(fs []Finding) string {
	var prot, missing, high, byMethod, low int
	for _, f := range fs {
		switch f.Verdict {
		case Protected:
			prot++
			if f.Severity == Low {
				low++
			}
		case MissingKey:
			missing++
			if f.Severity == High {
				high++
			}
		case IdempotentByMethod:
			byMethod++
		}
	}
	return fmt.Sprintf("%d operations: %d protected (%d with incomplete documentation), %d missing a key (%d high), %d idempotent by method",
		len(fs), prot, low, missing, high, byMethod)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// mdEscape makes s, which a document wrote, plain text in a Markdown table
// cell: it cannot end the cell, open a tag or an entity, or become a link,
// an image, an autolink or code (an operationId "[Approve](https://…)"
// stays text in a pull request comment).
func mdEscape(s string) string {
	s = mdEscaper.Replace(printable(s))
	// GitHub links a bare "www." too.
	for i := 0; i+4 <= len(s); i++ {
		if strings.EqualFold(s[i:i+4], "www.") {
			s = s[:i+3] + `\` + s[i+3:]
			i += 4
		}
	}
	return s
}

// mdEscaper escapes what Markdown reads as structure in a table cell: the
// cell border, HTML and entities, link and image brackets, code spans, and
// the ":" and "@" that GitHub's autolinks need.
var mdEscaper = strings.NewReplacer(
	"|", `\|`, "<", "&lt;", ">", "&gt;", "&", "&amp;", `\`, `\\`, "[", `\[`, "]", `\]`, "`", "\\`",
	":", `\:`, "@", `\@`,
)

// printable replaces control and invisible characters (a terminal escape,
// a newline in a path) with Go escapes, so that what a document says
// cannot rewrite the screen or forge a row.
func printable(s string) string {
	clean := true
	for _, r := range s {
		if !unicode.IsPrint(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if unicode.IsPrint(r) {
			b.WriteRune(r)
		} else {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
	}
	return b.String()
}

package lab

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Formats Write accepts.
const (
	FormatTable    = "table"
	FormatJSON     = "json"
	FormatMarkdown = "markdown"
)

// Write prints the report to w in format: FormatTable (aligned columns,
// then a "what this shows" line per row), FormatJSON (an array of the
// rows, each with exactly the ten counted fields) or FormatMarkdown (a
// table with a "what this shows" column).
func (rep *Report) Write(w io.Writer, format string) error {
	switch format {
	case FormatTable:
		return rep.writeTable(w)
	case FormatJSON:
		return rep.writeJSON(w)
	case FormatMarkdown:
		return rep.writeMarkdown(w)
	}
	return fmt.Errorf("lab: unknown format %q: use table, json or markdown", format)
}

func (rep *Report) writeJSON(w io.Writer) error {
	rows := rep.Results
	if rows == nil {
		rows = []Result{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rows)
}

// header is the line above a table: what ran, where, how.
func (rep *Report) header() string {
	s := fmt.Sprintf("%s: %d workers race for each key, %d keys per row", rep.Database, rep.Concurrency, rep.Rounds)
	if rep.Barrier {
		s += "; every worker waits at a barrier between its check and its insert"
	} else {
		s += "; no barrier"
	}
	if rep.UniqueCheckTable {
		s += "; the check strategies' table has a unique constraint"
	}
	return s + "."
}

var columns = []string{"strategy", "isolation", "rounds", "max/key", "duplicates", "deadlocks", "serialization", "unique", "other", "rounds/s"}

func (res Result) cells() []string {
	return []string{string(res.Strategy), string(res.Isolation), strconv.Itoa(res.Rounds), strconv.Itoa(res.MaxExecutionsPerKey),
		strconv.Itoa(res.Duplicates), strconv.Itoa(res.Deadlocks), strconv.Itoa(res.SerializationFailures),
		strconv.Itoa(res.UniqueViolations), strconv.Itoa(res.OtherErrors), strconv.FormatFloat(res.RoundsPerSec, 'f', 1, 64)}
}

func (rep *Report) writeTable(w io.Writer) error {
	var b strings.Builder
	b.WriteString(rep.header() + "\n\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(columns, "\t"))
	for _, res := range rep.Results {
		fmt.Fprintln(tw, strings.Join(res.cells(), "\t"))
	}
	tw.Flush()
	if len(rep.Results) > 0 {
		b.WriteString("\nWhat this shows:\n")
		for _, res := range rep.Results {
			fmt.Fprintf(&b, "  %s at %s: %s\n", res.Strategy, res.Isolation, res.Shows)
		}
	}
	for _, sk := range rep.Skipped {
		fmt.Fprintf(&b, "\nSkipped %s: %s.\n", sk.Isolation, sk.Reason)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (rep *Report) writeMarkdown(w io.Writer) error {
	var b strings.Builder
	b.WriteString(rep.header() + "\n\n")
	b.WriteString("| strategy | isolation | rounds | max executions per key | duplicates | deadlocks | serialization failures | unique violations | other errors | rounds/s | what this shows |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, res := range rep.Results {
		c := res.cells()
		c[0], c[1] = "`"+c[0]+"`", "`"+c[1]+"`"
		c = append(c, strings.ReplaceAll(res.Shows, "|", `\|`))
		b.WriteString("| " + strings.Join(c, " | ") + " |\n")
	}
	for _, sk := range rep.Skipped {
		fmt.Fprintf(&b, "\nSkipped `%s`: %s.\n", sk.Isolation, sk.Reason)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

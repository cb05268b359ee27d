package idem_test

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
)

// docRow is one row of a problem table in docs/problems.md.
type docRow struct {
	line     int
	table    int // 0: the middleware's, 1: the proxy's
	fragment string
	anchor   string
	statuses []int
	outcome  string
}

var (
	fragmentRE = regexp.MustCompile("`#([a-z0-9-]+)`")
	anchorRE   = regexp.MustCompile(`<a id="([^"]+)"></a>`)
	statusRE   = regexp.MustCompile(`\b[1-5][0-9][0-9]\b`)
	outcomeRE  = regexp.MustCompile("^`([a-z_]+)`$")
)

// problemRows parses the problem tables of docs/problems.md: every table
// whose header starts with "type (fragment)", in order.
func problemRows(t *testing.T) []docRow {
	t.Helper()
	b, err := os.ReadFile("docs/problems.md")
	if err != nil {
		t.Fatal(err)
	}
	var (
		rows    []docRow
		table   = -1
		inTable bool
	)
	for i, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "|") {
			inTable = false
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		switch {
		case !inTable && cells[0] == "type (fragment)":
			inTable, table = true, table+1
			if len(cells) < 3 || cells[1] != "status" || cells[2] != "Idempotency-Outcome" {
				t.Fatalf("docs/problems.md:%d: the columns must start type (fragment) | status | Idempotency-Outcome: %q", i+1, l)
			}
			continue
		case !inTable || strings.HasPrefix(cells[0], "---"):
			continue
		}
		r := docRow{line: i + 1, table: table}
		if m := fragmentRE.FindStringSubmatch(cells[0]); m != nil {
			r.fragment = m[1]
		}
		if m := anchorRE.FindStringSubmatch(cells[0]); m != nil {
			r.anchor = m[1]
		}
		for _, s := range statusRE.FindAllString(cells[1], -1) {
			n, _ := strconv.Atoi(s)
			r.statuses = append(r.statuses, n)
		}
		if m := outcomeRE.FindStringSubmatch(cells[2]); m != nil {
			r.outcome = m[1]
		}
		rows = append(rows, r)
	}
	if table != 1 {
		t.Fatalf("docs/problems.md has %d problem tables, want 2 (the middleware's and the proxy's)", table+1)
	}
	return rows
}

// TestProblemsDocMatchesSituations holds docs/problems.md to idem's table of
// situations: every situation with a problem type has exactly one row, in
// the middleware's table or (ProxyOnly) the proxy's, with its fragment (and
// the anchor the type URI points at), its status first, and its
// Idempotency-Outcome value; the doc has no row for an unknown fragment, and
// lists the situations in the order of Situations().
func TestProblemsDocMatchesSituations(t *testing.T) {
	t.Parallel()
	rows := problemRows(t)
	byFragment := map[string][]docRow{}
	for _, r := range rows {
		byFragment[r.fragment] = append(byFragment[r.fragment], r)
	}
	known := map[string]bool{}
	var order []string
	for _, s := range idem.Situations() {
		if s.Problem == "" {
			continue
		}
		frag, ok := strings.CutPrefix(s.Problem, idem.ProblemTypeBase)
		if !ok {
			t.Errorf("%s: problem type %q is not under %s", s.Name, s.Problem, idem.ProblemTypeBase)
			continue
		}
		known[frag] = true
		order = append(order, frag)
		got := byFragment[frag]
		if len(got) != 1 {
			t.Errorf("%s: docs/problems.md has %d rows for #%s, want 1", s.Name, len(got), frag)
			continue
		}
		r := got[0]
		wantTable := 0
		if s.ProxyOnly {
			wantTable = 1
		}
		if r.table != wantTable {
			t.Errorf("docs/problems.md:%d: #%s is in table %d, want %d (ProxyOnly %v)", r.line, frag, r.table+1, wantTable+1, s.ProxyOnly)
		}
		if r.anchor != frag {
			t.Errorf("docs/problems.md:%d: #%s has anchor %q, want %q", r.line, frag, r.anchor, frag)
		}
		if len(r.statuses) == 0 || r.statuses[0] != s.Status {
			t.Errorf("docs/problems.md:%d: #%s statuses %v, want %d first", r.line, frag, r.statuses, s.Status)
		}
		if r.outcome != s.Name {
			t.Errorf("docs/problems.md:%d: #%s Idempotency-Outcome %q, want %q", r.line, frag, r.outcome, s.Name)
		}
	}
	var docOrder []string
	for _, r := range rows {
		if !known[r.fragment] {
			t.Errorf("docs/problems.md:%d: row for unknown fragment %q (no situation has it)", r.line, r.fragment)
			continue
		}
		docOrder = append(docOrder, r.fragment)
	}
	if !t.Failed() && strings.Join(docOrder, " ") != strings.Join(order, " ") {
		t.Errorf("docs/problems.md lists %v, want the order of Situations(): %v", docOrder, order)
	}
}

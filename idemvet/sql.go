package idemvet

import (
	"go/ast"
	"go/token"
	"regexp"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// sqlStmt is one SQL statement found in a string constant.
type sqlStmt struct {
	pos        token.Pos
	seq        int    // order within the function
	insert     bool   // INSERT (or REPLACE, UPSERT); otherwise SELECT
	table      string // lower case, unquoted, without schema
	lock       string // the locking clause of a SELECT ("FOR UPDATE"), or ""
	onConflict bool   // an INSERT that settles a duplicate itself
}

var (
	// sqlLexeme finds, left to right, a string literal, a quoted
	// identifier or a comment, so that "--" in a string does not start a
	// comment and a quote in a comment does not start a string.
	sqlLexeme    = regexp.MustCompile(`(?s)'(?:[^']|'')*'|"(?:[^"]|"")*"|` + "`[^`]*`" + `|--[^\n]*|/\*.*?\*/`)
	sqlSpace     = regexp.MustCompile(`\s+`)
	selectFrom   = regexp.MustCompile(`(?i)^SELECT\b.*?\bFROM\s+([^\s,();]+)`)
	lockClause   = regexp.MustCompile(`(?i)\bFOR\s+(?:NO\s+KEY\s+)?UPDATE\b|\bFOR\s+(?:KEY\s+)?SHARE\b|\bLOCK\s+IN\s+SHARE\s+MODE\b`)
	insertInto   = regexp.MustCompile(`(?i)^(INSERT|REPLACE|UPSERT)\s+(?:(IGNORE|OR\s+\w+)\s+)?(?:INTO\s+)?([^\s,();]+)`)
	conflictPart = regexp.MustCompile(`(?i)\bON\s+CONFLICT\b|\bON\s+DUPLICATE\s+KEY\b`)
)

// parseSQL returns the SELECT and INSERT statements in s, or nothing when
// s does not look like SQL.
func parseSQL(s string, pos token.Pos, seq *int) []sqlStmt {
	s = sqlLexeme.ReplaceAllStringFunc(s, func(m string) string {
		switch m[0] {
		case '\'':
			return "''" // its text does not count
		case '"', '`':
			return m // an identifier, such as the table's name
		}
		return " " // a comment
	})
	var out []sqlStmt
	for _, part := range strings.Split(s, ";") {
		part = strings.TrimLeft(strings.TrimSpace(sqlSpace.ReplaceAllString(part, " ")), "( ")
		if m := selectFrom.FindStringSubmatch(part); m != nil {
			*seq++
			st := sqlStmt{pos: pos, seq: *seq, table: tableName(m[1])}
			if l := lockClause.FindString(part); l != "" {
				st.lock = strings.ToUpper(sqlSpace.ReplaceAllString(l, " "))
			}
			out = append(out, st)
		} else if m := insertInto.FindStringSubmatch(part); m != nil {
			*seq++
			out = append(out, sqlStmt{
				pos: pos, seq: *seq, insert: true, table: tableName(m[3]),
				onConflict: !strings.EqualFold(m[1], "INSERT") || m[2] != "" || conflictPart.MatchString(part),
			})
		}
	}
	return out
}

// tableName unquotes a table name and drops its schema.
func tableName(s string) string {
	if i := strings.LastIndexByte(s, '.'); i >= 0 {
		s = s[i+1:]
	}
	return strings.ToLower(strings.Trim(s, "\"`[]"))
}

// checkSQL reports, function by function, a key reserved by locking a row
// that may not exist, and check-then-insert on an idempotency table.
func checkSQL(pass *analysis.Pass, f *ast.File, ig *ignores) {
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			if n.Body != nil {
				checkSQLBody(pass, n.Body, ig)
			}
		case *ast.FuncLit:
			checkSQLBody(pass, n.Body, ig)
		}
		return true
	})
}

func checkSQLBody(pass *analysis.Pass, body *ast.BlockStmt, ig *ignores) {
	var stmts []sqlStmt
	seq := 0
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false // a function of its own
		case *ast.Ident:
			// A constant declared in this body is read where it is
			// declared, not again where it is used.
			if c := pass.TypesInfo.Uses[n]; c != nil && c.Pos() >= body.Pos() && c.Pos() < body.End() {
				return false
			}
			if s, ok := constString(pass.TypesInfo, n); ok {
				stmts = append(stmts, parseSQL(s, n.Pos(), &seq)...)
			}
			return false
		case ast.Expr:
			if s, ok := constString(pass.TypesInfo, n); ok {
				stmts = append(stmts, parseSQL(s, n.Pos(), &seq)...)
				return false
			}
		}
		return true
	})
	reported := map[int]bool{}
	for _, ins := range stmts {
		if !ins.insert {
			continue
		}
		for _, sel := range stmts {
			if sel.insert || sel.seq > ins.seq || sel.table != ins.table || reported[sel.seq] {
				continue
			}
			switch {
			case sel.lock != "":
				reported[sel.seq] = true
				ig.report(sel.pos, "SELECT … "+sel.lock+" on "+printable(sel.table)+" before INSERT into it: a row that does not exist yet cannot be locked, so two requests both find nothing and both insert, or deadlock on gap locks; reserve by INSERT against a unique constraint first ("+WhyInsertFirst+")")
			case strings.Contains(sel.table, "idempot") && !ins.onConflict:
				reported[sel.seq] = true
				ig.report(sel.pos, "check-then-insert on "+printable(sel.table)+": two requests both read no row before either inserts; reserve by INSERT against a unique constraint first and read the row only on conflict ("+WhyInsertFirst+")")
			}
		}
	}
}

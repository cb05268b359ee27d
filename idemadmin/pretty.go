package idemadmin

import (
	"bytes"
	"encoding/json"
	"html/template"
	"strings"
)

// maxPrettyBody bounds the bodies the page pretty-prints.
const maxPrettyBody = 2 * MaxAnswerBody

// prettyJSON returns body indented, when it is one JSON object or array,
// for the page to show beside the raw body; "" otherwise. Member order,
// numbers and escapes are kept as they are: only white space changes.
func prettyJSON(body string) string {
	t := strings.TrimSpace(body)
	if len(t) > maxPrettyBody || t == "" || (t[0] != '{' && t[0] != '[') {
		return ""
	}
	var b bytes.Buffer
	if err := json.Indent(&b, []byte(t), "", "  "); err != nil {
		return ""
	}
	return b.String()
}

// requestText is what was asked, as one line: method, path and query, or
// the operation when the request was not described.
func requestText(it Item) string {
	if it.Request == nil {
		return it.Operation
	}
	s := it.Request.Method + " " + it.Request.Path
	if it.Request.Query != "" {
		s += "?" + it.Request.Query
	}
	return s
}

// visibleLinesHTML is visibleHTML for a body the page indented itself:
// its line breaks stay line breaks, and every other character that would
// not show as itself is escaped.
func visibleLinesHTML(s string) template.HTML {
	lines := strings.Split(s, "\n")
	var b strings.Builder
	for i, l := range lines {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(string(visibleHTML(l)))
	}
	return template.HTML(b.String())
}

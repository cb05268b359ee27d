package audit

import (
	"fmt"
	"regexp"
	"strings"
)

// retentionWords are the words that say how long something is kept.
var retentionWords = regexp.MustCompile(`(?i)\b(expir\w*|retain\w*|retention|kept|stored\s+for|valid\s+for|ttl|time[\s-]to[\s-]live|purged?|forgotten|discarded)\b`)

// sentences splits prose into sentences, roughly.
var sentenceEnd = regexp.MustCompile(`[.!?]\s+|\n\s*\n|\n[-*]\s`)

// mentionsRetention reports whether a sentence of text says how long keys
// are kept. When aboutKey is false the sentence must also name
// idempotency or keys, so that "sessions expire after an hour" in a
// document's description does not count.
func mentionsRetention(text string, aboutKey bool) bool {
	for _, s := range sentenceEnd.Split(text, -1) {
		if !retentionWords.MatchString(s) {
			continue
		}
		l := strings.ToLower(s)
		if aboutKey || strings.Contains(l, "idempoten") || strings.Contains(l, "key") {
			return true
		}
	}
	return false
}

// extensionValue returns a non-empty rendering of the retention extension
// in exts, or "".
func extensionValue(exts map[string]any) string {
	v, ok := exts[RetentionExtension]
	if !ok || v == nil {
		return ""
	}
	s := strings.TrimSpace(fmt.Sprint(v))
	if s == "" {
		return ""
	}
	return s
}

// docRetention says where the document as a whole says how long keys are
// kept: its retention extension or its info description.
func (d *Document) docRetention() string {
	if v := extensionValue(d.spec.Extensions); v != "" {
		return RetentionExtension + ": " + v
	}
	if d.spec.Info != nil && mentionsRetention(d.spec.Info.Description, false) {
		return "in info.description"
	}
	return ""
}

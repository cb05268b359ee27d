package main_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsIndexNamesEveryDoc: docs/README.md, the index, links every
// document in docs/, and the README's layout names each one, so that a
// document added later cannot be missing from either.
func TestDocsIndexNamesEveryDoc(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil || len(docs) < 10 {
		t.Fatalf("docs/*.md: %d files, %v", len(docs), err)
	}
	index, err := os.ReadFile(filepath.Join(root, "docs", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	layout := string(readme)
	if i := strings.Index(layout, "## Layout"); i >= 0 {
		layout = layout[i:]
	} else {
		t.Fatal("README.md has no Layout section")
	}
	for _, d := range docs {
		name := filepath.Base(d)
		if name != "README.md" && !strings.Contains(string(index), "]("+name+")") {
			t.Errorf("docs/README.md does not link %s", name)
		}
		if !regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(name) + `\s`).MatchString(layout) {
			t.Errorf("README.md's layout does not name docs/%s", name)
		}
	}
}

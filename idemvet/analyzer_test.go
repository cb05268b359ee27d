package idemvet_test

import (
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"

	"github.com/idem-dev/idem/idemvet"
)

// TestAnalyzer runs the analyzer on every fixture package in one load (the
// standard library is type-checked once): wrapped and unwrapped routes on
// ServeMux and chi, middleware on groups and mounts, middleware from
// another package, false-positive guards, //idem:ignore, SQL, and the
// test and generated files that are not checked.
func TestAnalyzer(t *testing.T) {
	t.Parallel()
	analysistest.Run(t, analysistest.TestData(), idemvet.Analyzer,
		"servemux", "chirouter", "crosspkg", "sqlcheck", "skipped")
}

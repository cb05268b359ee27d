package idemvet_test

import (
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"

	"github.com/idem-dev/idem/idemvet"
)

// TestAnalyzerAttack runs the analyzer on the shapes in
// testdata/src/vetattack: constant patterns and methods, helpers that
// apply the middleware, chi's With, Route and Group, trailing
// //idem:ignore comments, and SQL in raw strings spanning lines.
func TestAnalyzerAttack(t *testing.T) {
	t.Parallel()
	analysistest.Run(t, analysistest.TestData(), idemvet.Analyzer, "vetattack")
}

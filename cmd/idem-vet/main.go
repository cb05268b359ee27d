// Command idem-vet runs idem's analyzer (package idemvet) as a standalone
// checker or as a vet tool:
//
//	idem-vet ./...
//	go vet -vettool=$(which idem-vet) ./...
//
// It reports POST and PATCH routes that idem's middleware does not
// protect, and SQL that reserves keys by SELECT … FOR UPDATE or
// check-then-insert. A line is suppressed with //idem:ignore and a reason.
package main

import (
	"golang.org/x/tools/go/analysis/singlechecker"

	"github.com/idem-dev/idem/idemvet"
)

func main() { singlechecker.Main(idemvet.Analyzer) }

// Command idem is the idempotency proxy and admin tool. Run "idem help" for
// the commands; the code lives in internal/cli.
package main

import (
	"os"

	"github.com/idem-dev/idem/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }

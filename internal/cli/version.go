package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// version is stamped at build time by make build:
//
//	go build -ldflags "-X github.com/idem-dev/idem/internal/cli.version=v1.2.3" ./cmd/idem
//
// Unstamped, the version comes from the module (go install …@v1.2.3) or the
// checkout the binary was built from.
var version = ""

// sourceVersion is the version of this source tree: the next release, with
// "-dev" until it is tagged. A binary that carries neither a stamp nor a
// module version nor VCS information (go build with -buildvcs=false, as
// GOFLAGS sets in many CI and container builds) reports it, so that it still
// says which line of releases it was built from.
const sourceVersion = "v0.1.0-dev"

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print idem's version and the Go version it was built with",
		Long:    "version prints idem's version (also idem --version), the commit it was built from when known, and the Go version and platform.",
		Example: "  idem version\n  idem --version",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), versionString())
			return nil
		},
	}
}

// versionString is "idem VERSION (go VERSION, OS/ARCH)".
func versionString() string {
	bi, _ := debug.ReadBuildInfo()
	return fmt.Sprintf("idem %s (%s, %s/%s)", versionOf(version, bi), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// versionOf is the version stamped at build time; else the module's version
// (go install …@v1.2.3, or the pseudo-version Go derives from the checkout);
// else "devel" with the commit; else sourceVersion, with a word on why
// nothing more is known and how to stamp a build.
func versionOf(stamped string, bi *debug.BuildInfo) string {
	rev, modified := "", false
	if bi != nil {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	v := stamped
	if v == "" && bi != nil && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	switch {
	case v != "":
		if rev != "" && !strings.Contains(v, rev) { // pseudo-versions name it
			v += " commit " + rev
		}
		return v
	case rev != "" && modified:
		return "devel (commit " + rev + ", with uncommitted changes)"
	case rev != "":
		return "devel (commit " + rev + ")"
	}
	return sourceVersion + " (no commit recorded: built without a version stamp or VCS information, as with -buildvcs=false; " +
		"make build, or go build -ldflags \"-X github.com/idem-dev/idem/internal/cli.version=v1.2.3\", stamps the exact one)"
}

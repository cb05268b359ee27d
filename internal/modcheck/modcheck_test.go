// Package modcheck checks that each of idem's modules resolves from a module
// of a user's own, as it would once published: with only the require and
// replace lines of the modules it uses, no go.work, and go mod tidy.
package modcheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// doors are the front-door modules and a program that uses each.
var doors = []struct{ module, main string }{
	{"", `package main

import "github.com/idem-dev/idem"

func main() { _ = idem.EngineConfig{} }
`},
	{"idemgrpc", `package main

import (
	"github.com/idem-dev/idem/idemgrpc"
	"google.golang.org/grpc"
)

func main() { _ = grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(nil, idemgrpc.Config{}))) }
`},
	{"idemconnect", `package main

import "github.com/idem-dev/idem/idemconnect"

func main() { _ = idemconnect.Config{} }
`},
	{"idemnats", `package main

import "github.com/idem-dev/idem/idemnats"

func main() { _ = idemnats.Config{} }
`},
	{"idemwatermill", `package main

import "github.com/idem-dev/idem/idemwatermill"

func main() { _ = idemwatermill.Config{} }
`},
}

// TestOutsideModules builds, for each front door, a module outside the
// repository that requires it (and idem's root module, which every door
// requires) through replace lines only, runs go mod tidy and go build with
// no workspace, and fails if a module cannot be resolved: a test helper
// that is a module of its own, say, that nothing publishes.
func TestOutsideModules(t *testing.T) {
	if testing.Short() {
		t.Skip("builds five modules from scratch; skipped with -short")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range doors {
		name := d.module
		if name == "" {
			name = "idem"
		}
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			mod := "module example.com/user\n\ngo 1.26.8\n\nreplace github.com/idem-dev/idem => " + root + "\n"
			if d.module != "" {
				mod += "\nreplace github.com/idem-dev/idem/" + d.module + " => " + filepath.Join(root, d.module) + "\n" +
					"\nrequire github.com/idem-dev/idem/" + d.module + " v0.0.0\n"
			} else {
				mod += "\nrequire github.com/idem-dev/idem v0.0.0\n"
			}
			write(t, filepath.Join(dir, "go.mod"), mod)
			write(t, filepath.Join(dir, "main.go"), d.main)
			for _, args := range [][]string{{"mod", "tidy"}, {"build", "./..."}, {"vet", "./..."}} {
				cmd := exec.CommandContext(t.Context(), "go", args...)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("go %s in a module that uses %s: %v\n%s", strings.Join(args, " "), name, err, out)
				}
			}
		})
	}
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

package main_test

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGoVetVettool builds idem-vet and runs it the way CI would, as
// go vet -vettool, on a fixture that uses the real chi and idem packages.
// go vet runs the tool on every dependency too (for facts), so a cold run
// takes a while; its results are cached after that.
func TestGoVetVettool(t *testing.T) {
	if testing.Short() {
		t.Skip("builds idem-vet and runs go vet over net/http, chi and idem")
	}
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "idem-vet")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command("go", "vet", "-vettool="+bin, "./testdata/app")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("go vet: %v, want exit status 1\n%s", err, out)
	}
	var got []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "testdata/") {
			got = append(got, l)
		}
	}
	want := []string{
		"testdata/app/app.go:20:2: POST /orders: mutating route without idempotency protection",
		"testdata/app/app.go:26:2: POST /legacy/refunds: mutating route without idempotency protection",
		"testdata/app/app.go:33:23: SELECT … FOR UPDATE on idempotency_keys before INSERT into it",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d findings, want %d:\n%s", len(got), len(want), out)
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w) {
			t.Errorf("finding %d: %q, want %q…", i, got[i], w)
		}
	}
}

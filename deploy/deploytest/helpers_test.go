package deploytest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// root is the repository's root, two folders up.
var root = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}()

// deployPath is a path under deploy/.
func deployPath(elem ...string) string {
	return filepath.Join(append([]string{root, "deploy"}, elem...)...)
}

// needTool returns the path of the program name, or skips the test with
// how to install it; when CI=true it fails instead, since CI installs
// every tool (scripts/tools.sh, which make test runs).
func needTool(tb testing.TB, name string) string {
	tb.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s is not installed and CI=true; run scripts/tools.sh", name)
		}
		tb.Skipf("%s is not installed; scripts/tools.sh installs it", name)
	}
	return path
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binOut  []byte
	binDir  string
)

// idemBinary builds the static idem binary (CGO_ENABLED=0, as make image
// does) once per test process.
func idemBinary(tb testing.TB) string {
	tb.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "idem-deploytest-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "idem")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-X github.com/idem-dev/idem/internal/cli.version=deploytest", "-o", binPath, "./cmd/idem")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		binOut, binErr = cmd.CombinedOutput()
	})
	if binErr != nil {
		tb.Fatalf("go build ./cmd/idem: %v\n%s", binErr, binOut)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

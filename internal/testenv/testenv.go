// Package testenv gives tests the URLs of the real servers they run
// against (scripts/services.sh starts the servers and prints the
// variables), and the helpers tests share.
package testenv

import (
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Getenv returns the environment variable name. When it is unset the test
// is skipped with a message saying how to set it, except when CI=true: a CI
// run must never pass by skipping, so the test fails instead.
func Getenv(tb testing.TB, name string) string {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s is not set and CI=true; run: eval \"$(scripts/services.sh)\"", name)
		}
		tb.Skipf("%s is not set; run: eval \"$(scripts/services.sh)\" to test against the real server", name)
	}
	return v
}

// Tool returns the path of the program name (a database's client or
// benchmark tool that a script runs), or skips the test with what provides
// it; when CI=true it fails instead, since CI installs every tool that
// the services need.
func Tool(tb testing.TB, name, provider string) string {
	tb.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s is not installed and CI=true; install %s", name, provider)
		}
		tb.Skipf("%s is not installed; install %s to run this test", name, provider)
	}
	return path
}

// CaptureStdout runs f and returns what it wrote to os.Stdout, so that a
// test can run an Example that needs a server and check its output. It
// replaces os.Stdout while f runs: tests that use it must not be parallel.
func CaptureStdout(tb testing.TB, f func()) string {
	tb.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	out := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		r.Close()
		out <- string(b)
	}()
	saved := os.Stdout
	os.Stdout = w
	func() {
		defer func() { // also when f panics
			os.Stdout = saved
			w.Close()
		}()
		f()
	}()
	return <-out
}

// WithParam returns the URL u with the query parameter name=value added.
func WithParam(u, name, value string) string {
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return u + sep + url.QueryEscape(name) + "=" + url.QueryEscape(value)
}

// LeakGrace is how long VerifyNoLeaks waits for goroutines to end: longer
// than rueidis v1.0.79's delayed close of the connections a Cluster
// client's topology refresh dropped (5s, from a goroutine Close does not
// stop; until then the dropped connections' readers and writers live too).
const LeakGrace = 10 * time.Second

// VerifyNoLeaks runs m's tests and, when they pass, fails the run if
// goroutines are left over, such as a client a test did not close or a
// subscription its cancel did not stop. It looks again for up to grace
// before it fails: a real leak outlives it. Call it from TestMain and pass
// its result to os.Exit. opts are goleak's, to ignore a library's
// goroutine that nothing can stop.
func VerifyNoLeaks(m *testing.M, grace time.Duration, opts ...goleak.Option) int {
	code := m.Run()
	if code != 0 {
		return code
	}
	deadline := time.Now().Add(grace)
	for {
		err := goleak.Find(opts...)
		if err == nil {
			return 0
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "goleak: goroutines left over after a successful test run: %v\n", err)
			return 1
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Clock is a fake clock for stores and engines (their Now settings): it
// stands still until a test moves it. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock reading t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock by d (back when d is negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

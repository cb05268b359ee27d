package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// stream is a `go test -json` run of three packages: one that passes, one
// whose test fails (with a subtest), one with no test files.
const stream = `{"Action":"start","Package":"a"}
{"Action":"run","Package":"a","Test":"TestOK"}
{"Action":"output","Package":"a","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"pass","Package":"a","Test":"TestOK","Elapsed":0.1}
{"Action":"skip","Package":"a","Test":"TestSkip","Elapsed":0}
{"Action":"start","Package":"b"}
{"Action":"output","Package":"b","Test":"TestBad","Output":"=== RUN   TestBad\n"}
{"Action":"output","Package":"b","Test":"TestBad/sub","Output":"    bad_test.go:9: want 1, got 2\n"}
{"Action":"fail","Package":"b","Test":"TestBad/sub","Elapsed":0}
{"Action":"fail","Package":"b","Test":"TestBad","Elapsed":0}
{"Action":"pass","Package":"a","Elapsed":1.5}
not json: go: downloading x
{"Action":"output","Package":"b","Output":"FAIL\n"}
{"Action":"fail","Package":"b","Elapsed":2}
{"Action":"start","Package":"c"}
{"Action":"output","Package":"c","Output":"?   \tc\t[no test files]\n"}
{"Action":"skip","Package":"c","Elapsed":0}
`

func TestRun(t *testing.T) {
	var out strings.Builder
	clock := time.Unix(0, 0)
	r := newRun(&out, func() time.Time { return clock })
	lines := strings.Split(strings.TrimSpace(stream), "\n")
	for i, l := range lines {
		if i == 6 { // b has run for a minute: the heartbeat names it
			clock = clock.Add(time.Minute)
			r.heartbeat()
		}
		r.line([]byte(l))
	}
	c := r.end()
	got := out.String()
	for _, want := range []string{
		"...   running: a (1m0s, 2 tests done), b (1m0s, 0 tests done)\n",
		"--- FAIL: TestBad (b)\n=== RUN   TestBad\n    bad_test.go:9: want 1, got 2\n",
		"ok    a 1.5s (1 passed, 0 failed, 1 skipped)\n",
		"not json: go: downloading x\n",
		"FAIL  b 2.0s (0 passed, 2 failed, 0 skipped)\n",
		"--    c (no tests)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "=== RUN   TestOK") {
		t.Errorf("a passing test's output was printed:\n%s", got)
	}
	if c != (counts{passed: 1, failed: 2, skipped: 1, pkgFailed: 1}) {
		t.Errorf("counts = %+v", c)
	}
}

// TestCutShort: a package that never ended (go test was killed) fails the
// run, with its own output.
func TestCutShort(t *testing.T) {
	var out strings.Builder
	r := newRun(&out, time.Now)
	r.line([]byte(`{"Action":"start","Package":"slow"}`))
	r.line([]byte(`{"Action":"output","Package":"slow","Output":"panic: test timed out after 20m0s\n"}`))
	if c := r.end(); c.pkgFailed != 1 {
		t.Errorf("pkgFailed = %d, want 1", c.pkgFailed)
	}
	if !strings.Contains(out.String(), "panic: test timed out") || !strings.Contains(out.String(), "FAIL  slow: no result") {
		t.Errorf("output:\n%s", out.String())
	}
}

func TestTally(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tally")
	for _, c := range []counts{{passed: 3, skipped: 1}, {passed: 2, failed: 1}} {
		if err := addTally(path, c); err != nil {
			t.Fatal(err)
		}
	}
	var out strings.Builder
	if code := printTotal(&out, path); code != 1 {
		t.Errorf("exit code %d with a failure in the tally, want 1", code)
	}
	if out.String() != "tests: 5 passed, 1 failed, 1 skipped\n" {
		t.Errorf("total: %q", out.String())
	}
	os.WriteFile(path, []byte("4 0 0 0\n"), 0o644)
	out.Reset()
	if code := printTotal(&out, path); code != 0 || out.String() != "tests: 4 passed, 0 failed, 0 skipped\n" {
		t.Errorf("total %q, exit %d", out.String(), code)
	}
}

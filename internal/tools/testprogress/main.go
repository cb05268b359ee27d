// Command testprogress reads `go test -json` on its standard input and prints
// what a person watching a long test run wants: a line per package as it
// ends (ok, FAIL or skipped, with its time and its tests' counts), the whole
// output of every failed test, and, while packages run, a line every
// -every naming those still running and how long they have run.
//
//	go test -json ./... | go run ./internal/tools/testprogress -tally .tmp/tally
//	go run ./internal/tools/testprogress -total .tmp/tally
//
// It exits 1 when a test, a package or a build failed, so that a pipeline
// under `set -o pipefail` fails too. With -tally it adds the run's counts to
// a file; -total prints the sum of that file as the run's closing line,
// "tests: N passed, N failed, N skipped".
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

// pkgState is what is known of a package while it runs.
type pkgState struct {
	start                   time.Time
	passed, failed, skipped int
	// outputs holds each running top-level test's output, its subtests'
	// included, kept until the test ends and printed only if it failed.
	outputs map[string]*strings.Builder
	// pkgOut is the package's own output (outside any test): a panic, a
	// build failure, TestMain's messages.
	pkgOut strings.Builder
}

// counts are a run's totals.
type counts struct{ passed, failed, skipped, pkgFailed int }

func main() {
	every := flag.Duration("every", time.Minute, "how often to name the packages still running (0: never)")
	tally := flag.String("tally", "", "add this run's counts to `file`")
	total := flag.String("total", "", "print the sum of the counts in `file` and exit (1 if any failed)")
	flag.Parse()
	if *total != "" {
		os.Exit(printTotal(os.Stdout, *total))
	}
	var mu sync.Mutex
	r := newRun(os.Stdout, time.Now)
	if *every > 0 {
		go func() {
			for range time.Tick(*every) {
				mu.Lock()
				r.heartbeat()
				mu.Unlock()
			}
		}()
	}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		mu.Lock()
		r.line(sc.Bytes())
		mu.Unlock()
	}
	mu.Lock()
	defer mu.Unlock()
	c := r.end()
	if *tally != "" {
		if err := addTally(*tally, c); err != nil {
			fmt.Fprintln(os.Stderr, "testprogress:", err)
			os.Exit(1)
		}
	} else {
		fmt.Fprintf(os.Stdout, "tests: %d passed, %d failed, %d skipped\n", c.passed, c.failed, c.skipped)
	}
	if c.failed > 0 || c.pkgFailed > 0 || sc.Err() != nil {
		os.Exit(1)
	}
}

// run follows one `go test -json` stream.
type run struct {
	out  io.Writer
	now  func() time.Time
	pkgs map[string]*pkgState
	c    counts
}

func newRun(out io.Writer, now func() time.Time) *run {
	return &run{out: out, now: now, pkgs: map[string]*pkgState{}}
}

// line takes one line of the stream. A line that is not an event (go
// test's own messages, a build error printed before -json took over) is
// printed as it is.
func (r *run) line(b []byte) {
	var ev event
	if len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &ev) != nil || ev.Action == "" {
		fmt.Fprintf(r.out, "%s\n", b)
		if strings.HasPrefix(string(b), "FAIL") || strings.Contains(string(b), "[build failed]") {
			r.c.pkgFailed++
		}
		return
	}
	if ev.Package == "" { // build output of a package that did not compile
		if ev.Action == "build-output" {
			fmt.Fprint(r.out, ev.Output)
		} else if ev.Action == "build-fail" {
			r.c.pkgFailed++
		}
		return
	}
	p := r.pkgs[ev.Package]
	if p == nil {
		p = &pkgState{start: r.now(), outputs: map[string]*strings.Builder{}}
		r.pkgs[ev.Package] = p
	}
	switch ev.Action {
	case "output":
		if ev.Test == "" {
			p.pkgOut.WriteString(ev.Output)
			return
		}
		// A subtest's output goes with its top-level test's, in order.
		top, _, _ := strings.Cut(ev.Test, "/")
		o := p.outputs[top]
		if o == nil {
			o = &strings.Builder{}
			p.outputs[top] = o
		}
		o.WriteString(ev.Output)
	case "pass", "fail", "skip":
		if ev.Test != "" {
			r.testEnded(ev, p)
			return
		}
		r.pkgEnded(ev, p)
	}
}

func (r *run) testEnded(ev event, p *pkgState) {
	switch ev.Action {
	case "pass":
		p.passed++
	case "skip":
		p.skipped++
	case "fail":
		p.failed++
		// A subtest's failure is printed with its parent's output, once.
		if !strings.Contains(ev.Test, "/") {
			if o := p.outputs[ev.Test]; o != nil {
				fmt.Fprintf(r.out, "--- FAIL: %s (%s)\n%s", ev.Test, ev.Package, o.String())
			}
		}
	}
	if !strings.Contains(ev.Test, "/") {
		delete(p.outputs, ev.Test)
	}
}

func (r *run) pkgEnded(ev event, p *pkgState) {
	delete(r.pkgs, ev.Package)
	r.c.passed += p.passed
	r.c.failed += p.failed
	r.c.skipped += p.skipped
	word := "ok  "
	switch {
	case ev.Action == "fail":
		word = "FAIL"
		r.c.pkgFailed++
		// The package's own output tells why: a panic, a timeout, TestMain.
		fmt.Fprint(r.out, p.pkgOut.String())
	case ev.Action == "skip" || p.passed+p.failed+p.skipped == 0:
		fmt.Fprintf(r.out, "--    %s (no tests)\n", ev.Package)
		return
	}
	fmt.Fprintf(r.out, "%s  %s %.1fs (%d passed, %d failed, %d skipped)\n",
		word, ev.Package, ev.Elapsed, p.passed, p.failed, p.skipped)
}

// heartbeat names the packages still running, longest first (by name
// among those that started together).
func (r *run) heartbeat() {
	if len(r.pkgs) == 0 {
		return
	}
	now := r.now()
	names := make([]string, 0, len(r.pkgs))
	for name := range r.pkgs {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int {
		if c := r.pkgs[a].start.Compare(r.pkgs[b].start); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(names))
	for i, name := range names {
		p := r.pkgs[name]
		parts[i] = fmt.Sprintf("%s (%s, %d tests done)", name, now.Sub(p.start).Round(time.Second), p.passed+p.failed+p.skipped)
	}
	fmt.Fprintf(r.out, "...   running: %s\n", strings.Join(parts, ", "))
}

// end reports packages that never ended (go test was killed) as failed.
func (r *run) end() counts {
	for name, p := range r.pkgs {
		fmt.Fprint(r.out, p.pkgOut.String())
		fmt.Fprintf(r.out, "FAIL  %s: no result (the run was cut short)\n", name)
		r.c.pkgFailed++
	}
	return r.c
}

// addTally appends c to the file at path.
func addTally(path string, c counts) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%d %d %d %d\n", c.passed, c.failed, c.skipped, c.pkgFailed)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// printTotal prints the sum of the tally at path and returns the exit code.
func printTotal(w io.Writer, path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testprogress:", err)
		return 1
	}
	var sum counts
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var c counts
		if _, err := fmt.Sscan(l, &c.passed, &c.failed, &c.skipped, &c.pkgFailed); err != nil {
			fmt.Fprintf(os.Stderr, "testprogress: %s: bad line %q\n", path, l)
			return 1
		}
		sum.passed += c.passed
		sum.failed += c.failed
		sum.skipped += c.skipped
		sum.pkgFailed += c.pkgFailed
	}
	fmt.Fprintf(w, "tests: %d passed, %d failed, %d skipped\n", sum.passed, sum.failed, sum.skipped)
	if sum.failed > 0 || sum.pkgFailed > 0 {
		return 1
	}
	return 0
}

package idemsqlite_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
)

// The multi-process test re-executes this test binary as helper processes.
// TestMain sends a process started with helperEnv set to runHelper instead
// of the tests.
const (
	helperEnv   = "IDEMSQLITE_TEST_HELPER" // the helper's name, "A" or "B"
	helperDBEnv = "IDEMSQLITE_TEST_HELPER_DB"
	helperKeys  = 200
	helperProcs = 2
)

func TestMain(m *testing.M) {
	if name := os.Getenv(helperEnv); name != "" {
		if err := runHelper(name, os.Getenv(helperDBEnv)); err != nil {
			fmt.Fprintf(os.Stderr, "helper %s: %v\n", name, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helperKey is the i-th key both helpers race for.
func helperKey(i int) idemstore.Key {
	return idemstore.Key{Scope: "tenant", Operation: "POST /charges", Key: fmt.Sprintf("key-%03d", i)}
}

// helperToken is the token helper name offers for key i.
func helperToken(name string, i int) string { return name + "-" + strconv.Itoa(i) }

// runHelper waits for stdin to close (the start signal), races the other
// helper to reserve every key from a few goroutines, then completes each key
// it won with its token as the body and prints "wins N".
func runHelper(name, path string) error {
	db, err := idemsqlite.Open(path, idemsqlite.OpenOptions{})
	if err != nil {
		return err
	}
	defer db.Close()
	s, err := idemsqlite.New(db, idemsqlite.Config{})
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, os.Stdin)

	ctx := context.Background()
	const workers = 4
	var (
		mu   sync.Mutex
		wins []int
		errs []error
		wg   sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < helperKeys; i += workers {
				tok := helperToken(name, i)
				rec, created, err := s.Reserve(ctx, idemstore.ReserveParams{
					Key: helperKey(i), Fingerprint: "fp", Token: tok, Lease: time.Hour,
				})
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, fmt.Errorf("reserve %d: %w", i, err))
				case created:
					wins = append(wins, i)
				case rec.Token == tok || !strings.HasSuffix(rec.Token, "-"+strconv.Itoa(i)):
					errs = append(errs, fmt.Errorf("reserve %d: lost, but the record holds token %q", i, rec.Token))
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, i := range wins {
		tok := helperToken(name, i)
		if err := s.Complete(ctx, idemstore.CompleteParams{
			Key: helperKey(i), Token: tok, Response: &idemstore.Response{Status: 201, Body: []byte(tok)},
			Retention: time.Hour,
		}); err != nil {
			return fmt.Errorf("complete %d: %w", i, err)
		}
	}
	fmt.Printf("wins %d\n", len(wins))
	return nil
}

func TestMultiProcessReserve(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "shared.db")
	db, err := idemsqlite.Open(path, idemsqlite.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := idemsqlite.New(db, idemsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}

	type child struct {
		name   string
		cmd    *exec.Cmd
		stdin  io.WriteCloser
		stdout strings.Builder
		stderr strings.Builder
	}
	var children []*child
	for n := range helperProcs {
		c := &child{name: string(rune('A' + n))}
		c.cmd = exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
		c.cmd.Env = append(os.Environ(), helperEnv+"="+c.name, helperDBEnv+"="+path)
		c.cmd.Stdout, c.cmd.Stderr = &c.stdout, &c.stderr
		if c.stdin, err = c.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children = append(children, c)
	}
	for _, c := range children { // both are running: let them race
		c.stdin.Close()
	}
	total := 0
	for _, c := range children {
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("helper %s: %v\nstderr:\n%s", c.name, err, c.stderr.String())
		}
		var wins int
		sc := bufio.NewScanner(strings.NewReader(c.stdout.String()))
		found := false
		for sc.Scan() {
			if _, err := fmt.Sscanf(sc.Text(), "wins %d", &wins); err == nil {
				found = true
			}
		}
		if !found {
			t.Fatalf("helper %s printed no result:\n%s", c.name, c.stdout.String())
		}
		t.Logf("helper %s won %d keys", c.name, wins)
		total += wins
	}
	if total != helperKeys {
		t.Fatalf("helpers won %d reservations in all, want exactly %d (one per key)", total, helperKeys)
	}

	// Every record is completed exactly once, by the process whose token it
	// holds.
	page, err := s.List(context.Background(), idemstore.ListParams{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Records) != helperKeys {
		t.Fatalf("%d records, want %d", len(page.Records), helperKeys)
	}
	for i, rec := range page.Records {
		if rec.Key != helperKey(i) {
			t.Fatalf("record %d is %v, want %v", i, rec.Key, helperKey(i))
		}
		if rec.State != idemstore.StateCompleted || rec.Response == nil || string(rec.Response.Body) != rec.Token {
			t.Fatalf("record %v: state %s token %q response %+v; want completed by its token holder", rec.Key, rec.State, rec.Token, rec.Response)
		}
	}
}

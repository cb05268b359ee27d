package testenv_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/idem-dev/idem/internal/testenv"
)

// TestGetenv runs the helper in a child process, so that a failing or
// skipping test can be observed from outside.
func TestGetenv(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") == "1" {
		t.Log("value:", testenv.Getenv(t, "TESTENV_PROBE"))
		return
	}
	cases := []struct {
		env  []string
		want string
	}{
		{[]string{"TESTENV_PROBE=x", "CI=true"}, "value: x"},
		{[]string{"CI=false"}, "SKIP"},
		{[]string{"CI=true"}, "FAIL"},
	}
	for _, tc := range cases {
		cmd := exec.Command(os.Args[0], "-test.run=^TestGetenv$", "-test.v")
		cmd.Env = append(os.Environ(), append(tc.env, "TESTENV_CHILD=1", "TESTENV_PROBE=")...)
		if strings.HasPrefix(tc.env[0], "TESTENV_PROBE=") {
			cmd.Env = append(os.Environ(), append([]string{"TESTENV_CHILD=1"}, tc.env...)...)
		}
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), tc.want) {
			t.Errorf("env %v: output lacks %q:\n%s", tc.env, tc.want, out)
		}
	}
}

// TestTool runs the helper in a child process, as TestGetenv does: a tool
// that is installed is found, a missing one skips the test, or fails it
// when CI=true.
func TestTool(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") == "1" {
		t.Log("path:", testenv.Tool(t, os.Getenv("TESTENV_TOOL"), "the probe package"))
		return
	}
	cases := []struct {
		tool, ci, want string
	}{
		{"sh", "true", "path: /"},
		{"idem-no-such-tool", "false", "SKIP"},
		{"idem-no-such-tool", "true", "FAIL"},
	}
	for _, tc := range cases {
		cmd := exec.Command(os.Args[0], "-test.run=^TestTool$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", "TESTENV_TOOL="+tc.tool, "CI="+tc.ci)
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), tc.want) {
			t.Errorf("tool %s, CI=%s: output lacks %q:\n%s", tc.tool, tc.ci, tc.want, out)
		}
	}
}

func TestCaptureStdout(t *testing.T) {
	got := testenv.CaptureStdout(t, func() {
		fmt.Println("one")
		fmt.Print("two")
	})
	if got != "one\ntwo" {
		t.Fatalf("CaptureStdout = %q", got)
	}
	if os.Stdout == nil || os.Stdout.Name() != "/dev/stdout" {
		t.Fatalf("os.Stdout not restored: %v", os.Stdout)
	}
}

func TestWithParam(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://h/db", "postgres://h/db?schema=a+b"},
		{"postgres://h/db?sslmode=disable", "postgres://h/db?sslmode=disable&schema=a+b"},
	} {
		if got := testenv.WithParam(tc.in, "schema", "a b"); got != tc.want {
			t.Errorf("WithParam(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

package main_test

// Attacks on what idem serve checks before it starts: files and variables
// it is given, and hostile configuration files.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestStartupErrorsOpenNoStore: a mistake in what idem serve is given
// besides the file's fields (a secret too short, a file that does not
// exist, a token file without the admin listener) is reported before the
// store is opened, so the default ./idem.db is never created.
func TestStartupErrorsOpenNoStore(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"short IDEM_SCOPE_SECRET", []string{"IDEM_SCOPE_SECRET=short"}, nil, "IDEM_SCOPE_SECRET"},
		{"bad IDEM_ENCRYPTION_KEY", []string{"IDEM_ENCRYPTION_KEY=short"}, nil, "IDEM_ENCRYPTION_KEY"},
		{"bad IDEM_ADMIN_TOKEN", []string{"IDEM_ADMIN_TOKEN=:"}, []string{"--admin", "127.0.0.1:0"}, "IDEM_ADMIN_TOKEN"},
		{"missing scope secret file", nil, []string{"--scope-secret-file", "/nonexistent/secret"}, "/nonexistent/secret"},
		{"missing encryption key file", nil, []string{"--encryption-key-file", "/nonexistent/keys"}, "/nonexistent/keys"},
		{"missing admin token file", nil, []string{"--admin", "127.0.0.1:0", "--admin-token-file", "/nonexistent/tokens"}, "/nonexistent/tokens"},
		{"token file without admin", nil, []string{"--admin-token-file", "/nonexistent/tokens"}, "admin_token_file needs the admin listener"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			args := append([]string{"serve", "--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:0"}, tt.args...)
			cmd := exec.CommandContext(t.Context(), binary, args...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), tt.env...)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("idem serve started:\n%s", out)
			}
			if !strings.Contains(string(out), tt.want) {
				t.Errorf("output %q does not name %q", out, tt.want)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("a refused start left %v", entries)
			}
		})
	}
}

// TestHostileConfigFiles: a file built to exhaust the parser (an alias
// bomb, nesting thousands deep, a field name of a megabyte) is refused
// with a message, before any store is opened.
func TestHostileConfigFiles(t *testing.T) {
	t.Parallel()
	bomb := "upstream: http://127.0.0.1:1\nx0: &a0 [a, a, a, a, a, a, a, a, a]\n"
	for i := 1; i < 9; i++ {
		bomb += "x" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [" + strings.Repeat("*a"+string(rune('0'+i-1))+", ", 8) + "*a" + string(rune('0'+i-1)) + "]\n"
	}
	tests := []struct{ name, yaml, want string }{
		{"alias bomb", bomb, "x0"},
		{"deep nesting", "upstream: http://127.0.0.1:1\nroutes: " + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + "\n", "line"},
		{"huge field name", "upstream: http://127.0.0.1:1\n" + strings.Repeat("r", 1<<20) + ": 1\n", "line 2"},
		{"mode as a list", "upstream: http://127.0.0.1:1\nmode: [observe]\n", "mode must be enforce or observe"},
		{"mode by alias", "upstream: http://127.0.0.1:1\nx: &observe enforce\nmode: *observe\n", `unknown field "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			cfg := filepath.Join(dir, "idem.yaml")
			if err := os.WriteFile(cfg, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.CommandContext(t.Context(), binary, "serve", "--config", cfg, "--listen", "127.0.0.1:0")
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("idem serve started with a hostile file")
			}
			if len(out) > 4<<10 {
				t.Errorf("a %d-byte message: %.300s…", len(out), out)
			}
			if !strings.Contains(string(out), tt.want) {
				t.Errorf("output %.500q does not contain %q", out, tt.want)
			}
			if strings.Contains(string(out), ".go:") || strings.Contains(string(out), "goroutine ") {
				t.Errorf("output shows Go internals: %.500s", out)
			}
			if _, err := os.Stat(filepath.Join(dir, "idem.db")); err == nil {
				t.Error("a hostile config file created ./idem.db")
			}
		})
	}
}

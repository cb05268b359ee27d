package deploytest

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemproxy"
)

// unitDirectives reads a unit file's Key=Value lines by key, in order.
func unitDirectives(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: not Key=Value: %q", path, line)
		}
		d[k] = append(d[k], v)
	}
	return d
}

// TestSystemdUnit: the unit is Type=notify, reloads with SIGHUP, is
// hardened, and waits longer than idem's shutdown_timeout before it kills.
func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	d := unitDirectives(t, deployPath("systemd", "idem.service"))
	want := map[string]string{
		"Type": "notify", "ExecReload": "/bin/kill -HUP $MAINPID", "KillSignal": "SIGTERM",
		"DynamicUser": "yes", "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
		"PrivateTmp": "yes", "PrivateDevices": "yes", "StateDirectory": "idem", "CapabilityBoundingSet": "",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX", "SystemCallArchitectures": "native",
		"MemoryDenyWriteExecute": "yes", "RestrictNamespaces": "yes", "LockPersonality": "yes",
	}
	for k, v := range want {
		if got := d[k]; len(got) == 0 || got[0] != v {
			t.Errorf("%s=%q; want %q", k, got, v)
		}
	}
	if f := d["SystemCallFilter"]; len(f) == 0 || f[0] != "@system-service" {
		t.Errorf("SystemCallFilter=%q; want @system-service first", f)
	}
	if !strings.HasPrefix(d["ExecStart"][0], "/usr/local/bin/idem serve --config /etc/idem/idem.yaml") {
		t.Errorf("ExecStart=%q", d["ExecStart"])
	}

	// TimeoutStopSec outlasts the shutdown_timeout of the idem.yaml that
	// ships beside the unit, and idem's default.
	stop, err := time.ParseDuration(d["TimeoutStopSec"][0])
	if err != nil {
		t.Fatalf("TimeoutStopSec: %v", err)
	}
	b, err := os.ReadFile(deployPath("systemd", "idem.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := idemproxy.ParseConfig(b)
	if err != nil {
		t.Fatalf("deploy/systemd/idem.yaml: %v", err)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("deploy/systemd/idem.yaml: %v", err)
	}
	def := idemproxy.Config{}.WithDefaults().ShutdownTimeout
	for name, d := range map[string]time.Duration{"idem.yaml's shutdown_timeout": time.Duration(cfg.ShutdownTimeout), "the default shutdown_timeout": time.Duration(def)} {
		if stop <= d+5*time.Second {
			t.Errorf("TimeoutStopSec %v is not well past %s (%v)", stop, name, d)
		}
	}
	// The credentials and the state folder the unit gives are the files
	// idem.yaml names.
	creds := map[string]bool{}
	for _, c := range d["LoadCredential"] {
		name, _, _ := strings.Cut(c, ":")
		creds["/run/credentials/idem.service/"+name] = true
	}
	for field, path := range map[string]string{"scope_secret_file": cfg.ScopeSecretFile, "admin_token_file": cfg.AdminTokenFile} {
		if !creds[path] {
			t.Errorf("idem.yaml's %s %q is no LoadCredential of the unit (%v)", field, path, d["LoadCredential"])
		}
	}
	if cfg.Store != "sqlite:///var/lib/idem/idem.db" {
		t.Errorf("idem.yaml's store %q is not in the unit's StateDirectory", cfg.Store)
	}
}

// TestSystemdAnalyzeVerify: systemd-analyze verify accepts the unit, with
// ExecStart pointed at a real idem binary, and prints nothing.
func TestSystemdAnalyzeVerify(t *testing.T) {
	t.Parallel()
	sa := needTool(t, "systemd-analyze")
	bin := idemBinary(t)
	b, err := os.ReadFile(deployPath("systemd", "idem.service"))
	if err != nil {
		t.Fatal(err)
	}
	unit := filepath.Join(t.TempDir(), "idem.service")
	if err := os.WriteFile(unit, []byte(strings.ReplaceAll(string(b), "/usr/local/bin/idem", bin)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", "--man=no", unit).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

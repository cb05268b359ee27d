package deploytest

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// run runs a command and returns its combined output, failing the test
// when it fails.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// buildImage builds deploy/Containerfile as make image does: the static
// binary in a context filled by scripts/image-context.sh. build is the
// command and its first arguments (podman build, buildah build).
func buildImage(t *testing.T, tag string, build ...string) {
	t.Helper()
	ctx := filepath.Join(t.TempDir(), "context")
	run(t, filepath.Join(root, "scripts", "image-context.sh"), ctx, idemBinary(t))
	args := append(build[1:], "-f", deployPath("Containerfile"), "-t", tag,
		"--build-arg", "VERSION=deploytest", "--build-arg", "REVISION=0000000", ctx)
	run(t, build[0], args...)
}

// TestImage builds the image with podman and checks what an operator
// relies on: its config (non-root user, entrypoint, labels, ports), a
// filesystem with no shell, and the binary in it, which serves and
// replays in front of a loopback upstream.
func TestImage(t *testing.T) {
	podman := needTool(t, "podman")
	tag := fmt.Sprintf("localhost/idem-deploytest:%d", os.Getpid())
	buildImage(t, tag, podman, "build", "--quiet")
	t.Cleanup(func() { exec.Command(podman, "rmi", "--force", tag).Run() })

	var inspect []struct {
		Config struct {
			User         string
			Entrypoint   []string
			Cmd          []string
			WorkingDir   string
			Labels       map[string]string
			ExposedPorts map[string]struct{}
		}
	}
	if err := json.Unmarshal([]byte(run(t, podman, "image", "inspect", tag)), &inspect); err != nil || len(inspect) != 1 {
		t.Fatalf("podman image inspect: %v", err)
	}
	cfg := inspect[0].Config
	if cfg.User != "65532:65532" {
		t.Errorf("user %q; want 65532:65532", cfg.User)
	}
	if strings.Join(cfg.Entrypoint, " ") != "/idem serve" {
		t.Errorf("entrypoint %q; want [/idem serve]", cfg.Entrypoint)
	}
	for _, p := range []string{"8080/tcp", "9090/tcp"} {
		if _, ok := cfg.ExposedPorts[p]; !ok {
			t.Errorf("port %s not exposed: %v", p, cfg.ExposedPorts)
		}
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.version":  "deploytest",
		"org.opencontainers.image.revision": "0000000",
		"org.opencontainers.image.source":   "https://github.com/idem-dev/idem",
		"org.opencontainers.image.licenses": "NOASSERTION",
		"org.opencontainers.image.title":    "idem",
	} {
		if got := cfg.Labels[k]; got != want {
			t.Errorf("label %s=%q; want %q", k, got, want)
		}
	}

	// The filesystem: export a container made from the image.
	id := strings.TrimSpace(run(t, podman, "create", tag))
	defer exec.Command(podman, "rm", "--force", id).Run()
	dir := t.TempDir()
	tarball := filepath.Join(dir, "fs.tar")
	run(t, podman, "export", "--output", tarball, id)
	files := untar(t, tarball, filepath.Join(dir, "fs"))
	for _, f := range []string{"idem", "etc/passwd", "etc/group", "etc/ssl/certs/ca-certificates.crt", "var/lib/idem"} {
		if _, ok := files[f]; !ok {
			t.Errorf("%s is not in the image", f)
		}
	}
	for f := range files {
		if strings.HasPrefix(f, "bin/") || strings.HasPrefix(f, "usr/") || strings.HasSuffix(f, "/sh") || f == "sh" {
			t.Errorf("%s is in the image: no shell, no tools", f)
		}
	}
	if h := files["var/lib/idem"]; h == nil || h.Uid != 65532 {
		t.Errorf("/var/lib/idem is not 65532's: %+v", h)
	}
	passwd, _ := os.ReadFile(filepath.Join(dir, "fs", "etc", "passwd"))
	if !strings.Contains(string(passwd), ":65532:65532:") {
		t.Errorf("/etc/passwd names no user 65532:\n%s", passwd)
	}
	bin := filepath.Join(dir, "fs", "idem")
	if out := run(t, bin, "--version"); !strings.Contains(out, "deploytest") {
		t.Errorf("idem --version: %q", out)
	}
	serveAndReplay(t, bin)

	t.Run("run", func(t *testing.T) {
		out, err := exec.Command(podman, "run", "--rm", "--network", "host", tag, "--version").CombinedOutput()
		if err != nil {
			if strings.Contains(string(out), "Operation not permitted") || strings.Contains(string(out), "permission denied") {
				t.Skipf("this machine does not let podman run containers (the OCI runtime is refused): %s", strings.TrimSpace(string(out)))
			}
			t.Fatalf("podman run: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "deploytest") {
			t.Errorf("podman run … --version: %q", out)
		}
	})
}

// TestImageBuildah: buildah builds the same Containerfile, to the same
// user and entrypoint.
func TestImageBuildah(t *testing.T) {
	buildah := needTool(t, "buildah")
	tag := fmt.Sprintf("localhost/idem-deploytest-buildah:%d", os.Getpid())
	buildImage(t, tag, buildah, "build", "--quiet")
	t.Cleanup(func() { exec.Command(buildah, "rmi", "--force", tag).Run() })
	var inspect struct {
		OCIv1 struct {
			Config struct {
				User       string
				Entrypoint []string
			}
		}
	}
	if err := json.Unmarshal([]byte(run(t, buildah, "inspect", "--type", "image", tag)), &inspect); err != nil {
		t.Fatal(err)
	}
	if c := inspect.OCIv1.Config; c.User != "65532:65532" || strings.Join(c.Entrypoint, " ") != "/idem serve" {
		t.Errorf("buildah's image: user %q, entrypoint %q", c.User, c.Entrypoint)
	}
}

// untar extracts a tarball into dir and returns its entries' headers by
// path (without a leading "./" or "/").
func untar(t *testing.T, tarball, dir string) map[string]*tar.Header {
	t.Helper()
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string]*tar.Header{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(h.Name, "./"), "/"), "/")
		if name == "" || strings.Contains(name, "..") {
			continue
		}
		files[name] = h
		p := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			os.MkdirAll(filepath.Dir(p), 0o755)
			out, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o755|0o600)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(out, tr); err != nil {
				t.Fatal(err)
			}
			out.Close()
		}
	}
	return files
}

// serveAndReplay runs bin serve in front of a loopback upstream: a
// protected POST is forwarded once, and its retry replays the answer.
func serveAndReplay(t *testing.T, bin string) {
	t.Helper()
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d}`, n)
	}))
	defer up.Close()
	cmd := exec.Command(bin, "serve", "--upstream", up.URL, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
		"--store", "sqlite://"+filepath.Join(t.TempDir(), "idem.db"), "--anonymous", "shared", "--log-format", "json")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("idem serve after SIGTERM: %v", err)
			}
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			t.Errorf("idem serve did not stop within a minute of SIGTERM")
		}
	}()
	addrs := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sent := false
		for sc.Scan() {
			var line struct{ Msg, Proxy, Admin string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "idem serve listening" && !sent {
				addrs <- [2]string{line.Proxy, line.Admin}
				sent = true
			}
		}
	}()
	var proxy, admin string
	select {
	case a := <-addrs:
		proxy, admin = a[0], a[1]
	case <-time.After(time.Minute):
		t.Fatal("idem serve did not log its listeners within a minute")
	}
	for _, probe := range []string{"/livez", "/readyz"} {
		resp, err := http.Get("http://" + admin + probe)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d", probe, resp.StatusCode)
		}
	}
	var bodies []string
	for i := range 2 {
		req, _ := http.NewRequest("POST", "http://"+proxy+"/charges", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "order-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		bodies = append(bodies, string(b))
		if resp.StatusCode != http.StatusCreated {
			t.Errorf("request %d: %d %s", i, resp.StatusCode, b)
		}
		if replayed := resp.Header.Get("Idempotent-Replayed") == "true"; replayed != (i == 1) {
			t.Errorf("request %d: Idempotent-Replayed %q", i, resp.Header.Get("Idempotent-Replayed"))
		}
	}
	if calls.Load() != 1 || bodies[0] != bodies[1] {
		t.Errorf("the upstream ran %d times; answers %q", calls.Load(), bodies)
	}
}

package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Build compiles `idem` (cmd/idem of this module) into dir and returns the
// binary's path; race builds it with the race detector, whose reports a
// Proc collects.
func Build(ctx context.Context, dir string, race bool) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("building idem needs the go command: %w", err)
	}
	bin := filepath.Join(dir, "idem")
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	args = append(args, "github.com/idem-dev/idem/cmd/idem")
	out, err := exec.CommandContext(ctx, goBin, args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin, nil
}

// Proc is one `idem serve` process that can be killed and started again on
// the same ports (or, if they were taken meanwhile, new ones, which Addr
// then returns). Its log lines go to LogPath.
type Proc struct {
	// Name tells the process apart in logs and reports.
	Name string
	// Bin is the idem binary, Args the arguments after "serve" except
	// --listen and --admin, which Proc chooses.
	Bin  string
	Args []string
	// LogPath receives the process's output, across restarts.
	LogPath string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	addr    string
	admin   string
	starts  int
	alarms  []string // race reports, panics, fatal errors
	logFile *os.File
}

// Addr is the proxy's address (host:port).
func (p *Proc) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// AdminAddr is the admin listener's address.
func (p *Proc) AdminAddr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.admin
}

// Starts is how many times the process was started.
func (p *Proc) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// Alarms returns the race reports, panics and fatal errors the process
// printed, each with its stack traces.
func (p *Proc) Alarms() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.alarms...)
}

// Running reports whether the process is running.
func (p *Proc) Running() bool {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	if exited == nil {
		return false
	}
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// Start starts the process and returns once it listens (not once its store
// is ready: see Ready). It reuses the previous ports; if one is taken, it
// starts on new ones.
func (p *Proc) Start(ctx context.Context) error {
	p.mu.Lock()
	addr, admin := p.addr, p.admin
	p.mu.Unlock()
	err := p.start(ctx, addr, admin)
	if err != nil && (addr != "" || admin != "") && ctx.Err() == nil {
		err = p.start(ctx, "", "")
	}
	return err
}

func (p *Proc) start(ctx context.Context, addr, admin string) error {
	if p.Running() {
		return fmt.Errorf("%s is already running", p.Name)
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	if admin == "" {
		admin = "127.0.0.1:0"
	}
	p.mu.Lock()
	if p.logFile == nil {
		f, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			p.mu.Unlock()
			return err
		}
		p.logFile = f
	}
	logFile := p.logFile
	p.mu.Unlock()

	args := append([]string{"serve"}, p.Args...)
	args = append(args, "--listen", addr, "--admin", admin, "--log-format", "json")
	cmd := exec.Command(p.Bin, args...)
	cmd.SysProcAttr = sysProcAttr()
	cmd.Stdout = logFile
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	fmt.Fprintf(logFile, "=== %s: start %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.Name, err)
	}
	listening := make(chan [2]string, 1)
	exited := make(chan struct{})
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		p.scan(stderr, logFile, listening)
	}()
	go func() {
		<-scanned // Wait closes the pipe: read it to the end first
		err := cmd.Wait()
		fmt.Fprintf(logFile, "=== %s: exited: %v\n", time.Now().Format(time.RFC3339Nano), err)
		close(exited)
	}()
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.starts++
	p.mu.Unlock()

	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case a := <-listening:
		p.mu.Lock()
		p.addr, p.admin = a[0], a[1]
		p.mu.Unlock()
		return nil
	case <-exited:
		return fmt.Errorf("%s exited before listening (see %s)", p.Name, p.LogPath)
	case <-t.C:
		_ = p.Kill()
		return fmt.Errorf("%s did not listen within 30s (see %s)", p.Name, p.LogPath)
	case <-ctx.Done():
		_ = p.Kill()
		return ctx.Err()
	}
}

// scan copies the process's log lines to w, reports the listening line's
// addresses on listening, and keeps alarming lines.
func (p *Proc) scan(r io.Reader, w io.Writer, listening chan<- [2]string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var report []string // a race report or a panic, until its end
	keep := func() {
		if len(report) > 0 {
			p.mu.Lock()
			p.alarms = append(p.alarms, strings.Join(report, "\n"))
			p.mu.Unlock()
			report = nil
		}
	}
	defer keep()
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(w, line)
		if len(report) > 0 {
			// A race report ends with a line of '='; a panic's trace with
			// the end of the output.
			report = append(report, line)
			if strings.HasPrefix(line, "==================") && len(report) > 1 {
				keep()
			}
			continue
		}
		if strings.HasPrefix(line, "{") {
			var rec struct {
				Msg   string `json:"msg"`
				Proxy string `json:"proxy"`
				Admin string `json:"admin"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "idem serve listening" {
				select {
				case listening <- [2]string{rec.Proxy, rec.Admin}:
				default:
				}
			}
			continue
		}
		if strings.Contains(line, "DATA RACE") || strings.HasPrefix(line, "panic:") || strings.HasPrefix(line, "fatal error:") {
			report = []string{line}
		}
	}
}

// Kill sends SIGKILL and waits for the process to exit.
func (p *Proc) Kill() error {
	return p.signal(syscall.SIGKILL, 10*time.Second)
}

// Stop sends SIGTERM and waits up to grace for a graceful exit, then kills.
func (p *Proc) Stop(grace time.Duration) error {
	if err := p.signal(syscall.SIGTERM, grace); err != nil {
		return p.Kill()
	}
	return nil
}

func (p *Proc) signal(sig os.Signal, wait time.Duration) error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-exited:
		return nil
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-exited:
		return nil
	case <-t.C:
		return fmt.Errorf("%s did not exit within %v of %v", p.Name, wait, sig)
	}
}

// Close kills the process if it runs and closes its log.
func (p *Proc) Close() error {
	err := p.Kill()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.logFile != nil {
		if cerr := p.logFile.Close(); err == nil {
			err = cerr
		}
		p.logFile = nil
	}
	return err
}

// Ready polls the admin listener's /readyz until it answers 200 (the store
// answers), the process exits, or ctx ends.
func (p *Proc) Ready(ctx context.Context) error {
	client := &http.Client{Timeout: 3 * time.Second}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	last := "no answer"
	for {
		if !p.Running() {
			return fmt.Errorf("%s is not running (see %s)", p.Name, p.LogPath)
		}
		resp, err := client.Get("http://" + p.AdminAddr() + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %s: %w", p.Name, last, ctx.Err())
		case <-tick.C:
		}
	}
}

// Tail returns the last n lines of the process's log.
func (p *Proc) Tail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

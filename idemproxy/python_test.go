package idemproxy_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
)

// python is Debian's Python, with python3-grpcio (scripts/tools.sh
// installs it); the interpreter first on PATH may be another without it.
const python = "/usr/bin/python3"

// needPythonGRPC skips the test when Debian's python3-grpcio is missing,
// and fails it when CI=true.
func needPythonGRPC(t *testing.T) {
	t.Helper()
	if err := exec.Command(python, "-c", "import grpc").Run(); err != nil {
		msg := "python3-grpcio is not installed for " + python + " (scripts/tools.sh installs it: apt-get install python3-grpcio python3-protobuf)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// pyServer is testdata/grpcpy/server.py running, with the executions it
// reported.
type pyServer struct {
	cmd  *exec.Cmd
	port string
	mu   sync.Mutex
	ran  []string // "Charge abc", …
	seen chan string
	done chan struct{}
	once sync.Once
}

func startPyServer(t *testing.T, port string) *pyServer {
	t.Helper()
	args := []string{"testdata/grpcpy/server.py"}
	if port != "" {
		args = append(args, port)
	}
	s := &pyServer{cmd: exec.Command(python, args...), seen: make(chan string, 64), done: make(chan struct{})}
	s.cmd.Stderr = os.Stderr
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.kill)
	first := make(chan string, 1)
	go func() {
		defer close(s.done)
		defer close(first)
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			first <- strings.TrimPrefix(sc.Text(), "port ")
		}
		for sc.Scan() {
			if r, ok := strings.CutPrefix(sc.Text(), "ran "); ok {
				s.mu.Lock()
				s.ran = append(s.ran, r)
				s.mu.Unlock()
				select {
				case s.seen <- r:
				default:
				}
			}
		}
	}()
	if s.port = <-first; s.port == "" {
		t.Fatal("the Python server did not start (its error is above)")
	}
	return s
}

// kill ends the server (once), and waits for its output to end.
func (s *pyServer) kill() {
	s.once.Do(func() {
		_ = s.cmd.Process.Kill()
		<-s.done
		_ = s.cmd.Wait()
	})
}

func (s *pyServer) count(exec string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.ran {
		if r == exec {
			n++
		}
	}
	return n
}

// startProxyFor runs idem serve in front of an h2c upstream at port.
func startProxyFor(t *testing.T, port, yaml string) *rpcEnv {
	t.Helper()
	env := &rpcEnv{}
	return env.start(t, "upstream: h2c://127.0.0.1:"+port+"\n"+yaml)
}

type pyCall struct {
	OK      bool                `json:"ok"`
	Body    string              `json:"body"`
	Code    string              `json:"code"`
	Details string              `json:"details"`
	Header  map[string][]string `json:"header"`
	Trailer map[string][]string `json:"trailer"`
}

// TestPythonGRPCBehindIdem: a Python grpcio client and server, idem serve
// between them over h2c: a retry replays the answer with its metadata, a
// failure with its status details and trailers; a key reused with other
// bytes is refused; 16 concurrent duplicates run once; a server-streaming
// call passes through.
func TestPythonGRPCBehindIdem(t *testing.T) {
	t.Parallel()
	needPythonGRPC(t)
	srv := startPyServer(t, "")
	env := startProxyFor(t, srv.port, "")
	out, err := exec.Command(python, "testdata/grpcpy/client.py", env.addr).Output()
	if err != nil {
		t.Fatalf("client.py: %v\n%s", err, out)
	}
	results := map[string]struct {
		Calls    []pyCall `json:"calls"`
		Messages []string `json:"messages"`
	}{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		var r struct {
			Scenario string   `json:"scenario"`
			Calls    []pyCall `json:"calls"`
			Messages []string `json:"messages"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		results[r.Scenario] = struct {
			Calls    []pyCall `json:"calls"`
			Messages []string `json:"messages"`
		}{r.Calls, r.Messages}
	}

	replay := results["replay"].Calls
	if len(replay) != 2 || !replay[0].OK || !replay[1].OK || replay[0].Body != "cba" || replay[1].Body != "cba" {
		t.Fatalf("replay: %+v", replay)
	}
	if replay[0].Header["x-charge"] == nil || replay[1].Header["x-charge"] == nil || replay[1].Trailer["x-ledger"] == nil {
		t.Errorf("replay lost metadata: %+v", replay)
	}
	if replay[0].Header["idempotent-replayed"] != nil || strings.Join(replay[1].Header["idempotent-replayed"], "") != "true" {
		t.Errorf("idempotent-replayed: %v, %v", replay[0].Header, replay[1].Header)
	}
	if n := srv.count("Charge abc"); n != 1 {
		t.Errorf("Charge abc ran %d times", n)
	}

	errs := results["error"].Calls
	if len(errs) != 2 {
		t.Fatalf("error: %+v", errs)
	}
	for i, c := range errs {
		if c.OK || c.Code != "FAILED_PRECONDITION" || c.Details != "card declined" || c.Trailer["x-decline"] == nil {
			t.Errorf("error call %d: %+v", i, c)
		}
	}
	d0, d1 := strings.Join(errs[0].Trailer["grpc-status-details-bin"], ""), strings.Join(errs[1].Trailer["grpc-status-details-bin"], "")
	if d0 == "" || d0 != d1 {
		t.Errorf("status details: first %q, replay %q", d0, d1)
	}
	if n := srv.count("Charge decline"); n != 1 {
		t.Errorf("Charge decline ran %d times", n)
	}

	mm := results["mismatch"].Calls
	if len(mm) != 1 || mm[0].Code != "FAILED_PRECONDITION" || !strings.Contains(decoded(mm[0].Trailer["grpc-status-details-bin"]), "KEY_REUSED") {
		t.Errorf("mismatch: %+v", mm)
	}
	if n := srv.count("Charge other"); n != 0 {
		t.Errorf("a reused key ran %d times", n)
	}

	conc := results["concurrent"].Calls
	for i, c := range conc {
		if !c.OK || c.Body != "pud" {
			t.Errorf("concurrent call %d: %+v", i, c)
		}
	}
	if len(conc) != 16 || srv.count("Charge dup") != 1 {
		t.Errorf("16 duplicates: %d answers, %d runs", len(conc), srv.count("Charge dup"))
	}

	if got := strings.Join(results["stream"].Messages, ","); got != "w0,w1,w2" {
		t.Errorf("stream: %q", got)
	}
}

func decoded(vs []string) string {
	var b strings.Builder
	for _, v := range vs {
		d, _ := base64.StdEncoding.DecodeString(v)
		b.Write(d)
	}
	return b.String()
}

// rawCodec sends and receives messages as bytes.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

var _ encoding.Codec = rawCodec{}

// TestUpstreamKilledMidCallRunsOnce: the Python server is killed while it
// runs a call; idem sends the key to review (the call may have run), and
// the retry, against the server restarted on its port, does not run it. A
// call made while it is down was never sent: released, and its retry runs.
func TestUpstreamKilledMidCallRunsOnce(t *testing.T) {
	t.Parallel()
	needPythonGRPC(t)
	srv := startPyServer(t, "")
	env := startProxyFor(t, srv.port, "")
	cc, err := grpc.NewClient(env.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	callAs := func(key, body string) error {
		in, out := []byte(body), []byte(nil)
		ctx, cancel := context.WithTimeout(keyed(key), 30*time.Second)
		defer cancel()
		return cc.Invoke(ctx, "/pay.Payments/Charge", &in, &out)
	}
	call := func() error { return callAs("chaos-1", "hang") }
	first := make(chan error, 1)
	go func() { first <- call() }()
	if r := <-srv.seen; r != "Charge hang" {
		t.Fatalf("the server ran %q", r)
	}
	srv.kill()
	err = <-first
	if status.Code(err) != codes.Unknown || reasonOf(err) != "UPSTREAM_FAILED" {
		t.Errorf("the call whose upstream died: %v", err)
	}
	// While it is down, a call is not sent: its key is released, and its
	// retry runs once the server is back.
	if err := callAs("chaos-2", "later"); status.Code(err) != codes.Unavailable || reasonOf(err) != "UPSTREAM_UNREACHABLE" {
		t.Errorf("a call to the dead upstream: %v", err)
	}
	again := startPyServer(t, srv.port)
	if err := callAs("chaos-2", "later"); err != nil || again.count("Charge later") != 1 {
		t.Errorf("the retry of a call that was not sent: %v, ran %d times", err, again.count("Charge later"))
	}
	err = call()
	if status.Code(err) != codes.FailedPrecondition || reasonOf(err) != "NEEDS_REVIEW" {
		t.Errorf("the retry: %v", err)
	}
	if n := srv.count("Charge hang") + again.count("Charge hang"); n != 1 {
		t.Errorf("the call ran %d times", n)
	}
}

package idemproxy_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/idem-dev/idem/internal/rpctest/testpb"
)

// testCA is a certificate authority for the tests' listeners and clients.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "idem test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns the PEM certificate and key of a leaf named cn, for
// 127.0.0.1 (a server) and client authentication.
func (ca *testCA) issue(t *testing.T, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// tlsFiles writes a server certificate issued by ca and returns the yaml
// that serves it.
func tlsFiles(t *testing.T, ca *testCA, cn string) (yaml, certPath, keyPath string) {
	t.Helper()
	dir := t.TempDir()
	certPath, keyPath = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	c, k := ca.issue(t, cn)
	writeFile(t, certPath, c)
	writeFile(t, keyPath, k)
	return "tls_cert: " + certPath + "\ntls_key: " + keyPath + "\n", certPath, keyPath
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// servedName is the common name of the certificate the listener at addr
// presents.
func servedName(t *testing.T, addr string, ca *testCA) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.pool(), NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Errorf("ALPN chose %q, want h2", p)
	}
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// TestGRPCOverTLS: with tls_cert and tls_key, a gRPC client reaches the
// upstream through idem over h2 (ALPN), protected; an HTTP/1.1 client
// still can.
func TestGRPCOverTLS(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	yaml, _, _ := tlsFiles(t, ca, "first")
	env := startRPC(t, yaml)
	cc, err := grpc.NewClient(env.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.pool()})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	c := testpb.NewPaymentsClient(cc)
	for range 2 {
		p, err := c.Charge(keyed("tls-1"), &testpb.ChargeRequest{Account: "tls"})
		if err != nil || p.GetRun() != 1 {
			t.Fatalf("over TLS: %v %v", p, err)
		}
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool()}, ForceAttemptHTTP2: false}}
	t.Cleanup(hc.CloseIdleConnections)
	resp, err := hc.Get("https://" + env.addr + "/anything")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 1 {
		t.Errorf("an HTTP/1.1 client was answered in %s", resp.Proto)
	}
}

// TestTLSReloadKeepsTheCertificateOnABadFile: SIGHUP's reload reads the
// certificate again; a file that does not load refuses the reload and the
// running certificate stays served; a good one is served from the next
// handshake.
func TestTLSReloadKeepsTheCertificateOnABadFile(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	yaml, certPath, keyPath := tlsFiles(t, ca, "first")
	env := startRPC(t, yaml)
	if got := servedName(t, env.addr, ca); got != "first" {
		t.Fatalf("serves %q", got)
	}
	writeFile(t, certPath, []byte("not a certificate"))
	if _, err := env.srv.Reload(env.srv.Config); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("Reload of a bad certificate: %v", err)
	}
	if got := servedName(t, env.addr, ca); got != "first" {
		t.Errorf("after a bad reload, serves %q", got)
	}
	c, k := ca.issue(t, "second")
	writeFile(t, certPath, c)
	writeFile(t, keyPath, k)
	if _, err := env.srv.Reload(env.srv.Config); err != nil {
		t.Fatal(err)
	}
	if got := servedName(t, env.addr, ca); got != "second" {
		t.Errorf("after a good reload, serves %q", got)
	}
}

// TestMutualTLSRequiresAClientCertificate: with tls_client_ca, a client
// without a certificate from it is refused at the handshake and nothing
// reaches the upstream; one with a certificate is served.
func TestMutualTLSRequiresAClientCertificate(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	yaml, _, _ := tlsFiles(t, ca, "server")
	caPath := filepath.Join(t.TempDir(), "ca.pem")
	writeFile(t, caPath, ca.pem)
	env := startRPC(t, yaml+"tls_client_ca: "+caPath+"\n")
	call := func(cfg *tls.Config) error {
		cc, err := grpc.NewClient(env.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			return err
		}
		defer cc.Close()
		_, err = testpb.NewPaymentsClient(cc).Charge(keyed("mtls"), &testpb.ChargeRequest{Account: "mtls"})
		return err
	}
	if err := call(&tls.Config{RootCAs: ca.pool()}); err == nil {
		t.Error("a client without a certificate was served")
	}
	other := newTestCA(t)
	oc, ok := other.issue(t, "intruder")
	pair, _ := tls.X509KeyPair(oc, ok)
	if err := call(&tls.Config{RootCAs: ca.pool(), Certificates: []tls.Certificate{pair}}); err == nil {
		t.Error("a client with a certificate from another CA was served")
	}
	if n := env.pay.runsOf("mtls"); n != 0 {
		t.Fatalf("the upstream ran %d times for refused clients", n)
	}
	cc, ck := ca.issue(t, "client")
	pair, _ = tls.X509KeyPair(cc, ck)
	if err := call(&tls.Config{RootCAs: ca.pool(), Certificates: []tls.Certificate{pair}}); err != nil {
		t.Errorf("a client with a certificate: %v", err)
	}
}

// TestAdminTLS: admin_tls_cert and admin_tls_key serve the admin listener
// over TLS; the proxy's listener stays as configured (cleartext here).
func TestAdminTLS(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	_, certPath, keyPath := tlsFiles(t, ca, "admin")
	env := startRPC(t, "admin_tls_cert: "+certPath+"\nadmin_tls_key: "+keyPath+"\n")
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool()}}}
	t.Cleanup(hc.CloseIdleConnections)
	resp, err := hc.Get("https://" + env.admin + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.TLS == nil {
		t.Errorf("admin over TLS: %d", resp.StatusCode)
	}
	if plain, err := http.Get("http://" + env.admin + "/healthz"); err == nil {
		plain.Body.Close()
		if plain.StatusCode == http.StatusOK {
			t.Error("the admin listener served cleartext")
		}
	}
	if got := servedNameOrErr(env.addr, ca); got != "" {
		t.Errorf("the proxy's cleartext listener did a TLS handshake: %q", got)
	}
}

func servedNameOrErr(addr string, ca *testCA) string {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, &tls.Config{RootCAs: ca.pool()})
	if err != nil {
		return ""
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// TestReloadNamesProtocolRestarts: a reload that changes the listeners'
// TLS files or the descriptor set names them among what needs a restart.
func TestReloadNamesProtocolRestarts(t *testing.T) {
	t.Parallel()
	env := startRPC(t, "")
	next := env.srv.Config
	next.ProtoDescriptorSet = descriptorSet(t)
	next.MaxConcurrentStreams = 7
	restart, err := env.srv.Reload(next)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(restart, ","); !strings.Contains(got, "proto_descriptor_set") || !strings.Contains(got, "max_concurrent_streams") {
		t.Errorf("restart names %q", got)
	}
}

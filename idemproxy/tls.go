package idemproxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"reflect"
	"strings"
	"sync/atomic"
)

// Protocols are what the listeners and the upstream speak beyond
// HTTP/1.1. The proxy's listener always serves HTTP/1.1 and HTTP/2 with
// prior knowledge (h2c) on one port; with TLSCert and TLSKey it serves
// TLS instead, HTTP/2 and HTTP/1.1 chosen by ALPN.
type Protocols struct {
	// TLSCert and TLSKey are the PEM files of the proxy listener's
	// certificate (its chain) and private key. Both or neither; they are
	// read again on SIGHUP (Server.Reload), and a pair that does not load
	// then leaves the running certificate in place. Defaults to none:
	// cleartext.
	TLSCert string `yaml:"tls_cert"`
	TLSKey  string `yaml:"tls_key"`
	// TLSClientCA, with TLSCert, is a PEM file of the certificate
	// authorities that sign clients' certificates: a client must then
	// present one they signed (mutual TLS). Read again on SIGHUP.
	// Defaults to none: no client certificate asked.
	TLSClientCA string `yaml:"tls_client_ca"`
	// AdminTLSCert, AdminTLSKey and AdminTLSClientCA are the same for the
	// admin listener. Defaults to none.
	AdminTLSCert     string `yaml:"admin_tls_cert"`
	AdminTLSKey      string `yaml:"admin_tls_key"`
	AdminTLSClientCA string `yaml:"admin_tls_client_ca"`
	// MaxConcurrentStreams bounds the HTTP/2 streams (calls) a client
	// connection may have open at once. With each, a client that resets
	// streams as it opens them (rapid reset) keeps more handlers busy
	// before Go's server closes its connection (BENCHMARKS.md). Defaults
	// to 100, the least RFC 9113 recommends.
	MaxConcurrentStreams int `yaml:"max_concurrent_streams"`
	// ProtoDescriptorSet is a FileDescriptorSet file (protoc
	// --include_imports --descriptor_set_out, or buf build -o) of the
	// upstream's gRPC services. With it, protected gRPC and Connect calls
	// also take their key from AIP-155 request_id and AEP-155
	// idempotency_key fields, are fingerprinted by their decoded message
	// (as idemgrpc does), and streaming methods are told from unary ones.
	// Without it, a call's key comes from its idempotency-key metadata
	// only, and its fingerprint covers the message's bytes. Defaults to
	// none.
	ProtoDescriptorSet string `yaml:"proto_descriptor_set"`
}

// DefaultMaxConcurrentStreams is Protocols.MaxConcurrentStreams' default.
const DefaultMaxConcurrentStreams = 100

func (p Protocols) validate() error {
	if (p.TLSCert == "") != (p.TLSKey == "") {
		return errors.New("tls_cert and tls_key (--tls-cert, --tls-key) go together: set both or neither")
	}
	if p.TLSClientCA != "" && p.TLSCert == "" {
		return errors.New("tls_client_ca (--tls-client-ca) needs tls_cert and tls_key: mutual TLS is TLS")
	}
	if (p.AdminTLSCert == "") != (p.AdminTLSKey == "") {
		return errors.New("admin_tls_cert and admin_tls_key go together: set both or neither")
	}
	if p.AdminTLSClientCA != "" && p.AdminTLSCert == "" {
		return errors.New("admin_tls_client_ca needs admin_tls_cert and admin_tls_key")
	}
	if p.MaxConcurrentStreams < 0 {
		return errors.New("max_concurrent_streams must not be negative")
	}
	return nil
}

// restartFields names the settings that differ and only a restart applies
// (the TLS files' contents are read again on reload; their names are not).
func (p Protocols) restartFields(next Protocols) []string {
	var out []string
	rv, nv := reflect.ValueOf(p), reflect.ValueOf(next)
	t := rv.Type()
	for i := range t.NumField() {
		if !reflect.DeepEqual(rv.Field(i).Interface(), nv.Field(i).Interface()) {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
			out = append(out, name)
		}
	}
	return out
}

// certSource serves a listener's certificate and client CAs, loaded from
// their files at start and again by reload.
type certSource struct {
	certFile, keyFile, caFile string
	cur                       atomic.Pointer[tls.Config]
}

func newCertSource(cert, key, ca string) (*certSource, error) {
	s := &certSource{certFile: cert, keyFile: key, caFile: ca}
	if err := s.reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// reload reads the files again. On any error the running certificate and
// CAs stay in place.
func (s *certSource) reload() error {
	cert, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
	if err != nil {
		return fmt.Errorf("TLS certificate %s, key %s: %w", s.certFile, s.keyFile, err)
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2", "http/1.1"},
	}
	if s.caFile != "" {
		pem, err := os.ReadFile(s.caFile)
		if err != nil {
			return fmt.Errorf("TLS client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("TLS client CA %s: no PEM certificate in it", s.caFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	s.cur.Store(cfg)
	return nil
}

// config is the listener's tls.Config: each handshake takes the loaded
// certificate and CAs of the moment.
func (s *certSource) config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.cur.Load(), nil
		},
	}
}

// serveProtocols sets srv to serve HTTP/1.1 and HTTP/2 (h2c on a
// cleartext listener, h2 by ALPN on TLS), with HTTP/2's limits, and wraps
// ln in TLS when certs is set.
func serveProtocols(srv *http.Server, ln net.Listener, certs *certSource, cfg Config) net.Listener {
	var p http.Protocols
	p.SetHTTP1(true)
	if certs != nil {
		p.SetHTTP2(true)
	} else {
		p.SetUnencryptedHTTP2(true)
	}
	srv.Protocols = &p
	streams := cfg.MaxConcurrentStreams
	if streams == 0 {
		streams = DefaultMaxConcurrentStreams
	}
	srv.HTTP2 = &http.HTTP2Config{
		MaxConcurrentStreams: streams,
		// The header list is bounded as HTTP/1.1's is (max_header_bytes),
		// and the HPACK table a client may make the proxy keep is 4 KiB.
		MaxDecoderHeaderTableSize: 4 << 10,
		MaxEncoderHeaderTableSize: 4 << 10,
		MaxReadFrameSize:          16 << 10,
		// Request bodies are read into the body budget as they arrive:
		// the flow-control windows bound what a client may send ahead.
		MaxReceiveBufferPerConnection: 1 << 20,
		MaxReceiveBufferPerStream:     256 << 10,
	}
	if certs == nil {
		return ln
	}
	srv.TLSConfig = certs.config()
	return tls.NewListener(ln, srv.TLSConfig)
}

// loadCerts loads the proxy and admin listeners' certificates, where cfg
// names them.
func loadCerts(cfg Config) (proxy, admin *certSource, err error) {
	if cfg.TLSCert != "" {
		if proxy, err = newCertSource(cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA); err != nil {
			return nil, nil, err
		}
	}
	if cfg.AdminTLSCert != "" && cfg.Admin != "" {
		if admin, err = newCertSource(cfg.AdminTLSCert, cfg.AdminTLSKey, cfg.AdminTLSClientCA); err != nil {
			return nil, nil, fmt.Errorf("admin: %w", err)
		}
	}
	return proxy, admin, nil
}

// reloadCerts reads the listeners' certificate files again. A file that
// does not load refuses the reload, and every listener keeps the
// certificate it had.
func reloadCerts(certs []*certSource) error {
	prev := make([]*tls.Config, len(certs))
	for i, c := range certs {
		if c == nil {
			continue
		}
		prev[i] = c.cur.Load()
		if err := c.reload(); err != nil {
			for j := range i {
				if certs[j] != nil {
					certs[j].cur.Store(prev[j])
				}
			}
			return fmt.Errorf("reload refused, the running certificates kept: %w", err)
		}
	}
	return nil
}

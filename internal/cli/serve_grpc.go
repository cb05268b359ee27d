package cli

import (
	"github.com/spf13/pflag"

	"github.com/idem-dev/idem/idemproxy"
)

// protocolFlags are idem serve's TLS, HTTP/2 and gRPC flags (see
// idemproxy.Protocols); set ones override the file.
type protocolFlags struct {
	tlsCert, tlsKey, tlsClientCA string
	descriptorSet                string
	maxStreams                   int
	grpcStreams                  string
}

func (p *protocolFlags) add(fl *pflag.FlagSet) {
	fl.StringVar(&p.tlsCert, "tls-cert", "", "PEM certificate (chain) of the proxy listener: serve TLS, HTTP/2 and HTTP/1.1 by ALPN (read again on SIGHUP); without, the listener serves HTTP/1.1 and h2c")
	fl.StringVar(&p.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	fl.StringVar(&p.tlsClientCA, "tls-client-ca", "", "PEM certificate authorities whose client certificates the TLS listener requires (mutual TLS)")
	fl.StringVar(&p.descriptorSet, "proto-descriptor-set", "", "FileDescriptorSet of the upstream's gRPC services (protoc --include_imports --descriptor_set_out, or buf build -o): keys from AIP-155 request_id and AEP-155 idempotency_key fields, canonical fingerprints of decoded messages, streaming methods told apart")
	fl.IntVar(&p.maxStreams, "max-concurrent-streams", idemproxy.DefaultMaxConcurrentStreams, "HTTP/2 streams (calls) a client connection may have open at once")
	fl.StringVar(&p.grpcStreams, "grpc-streams", string(idemproxy.GRPCStreamsPass), "streaming gRPC and Connect calls, which idem never protects: pass (unbuffered) or refuse (FAILED_PRECONDITION); grpc_streams: per route in --config")
}

func (p *protocolFlags) apply(cfg *idemproxy.Config, fl *pflag.FlagSet) {
	if fl.Changed("tls-cert") {
		cfg.TLSCert = p.tlsCert
	}
	if fl.Changed("tls-key") {
		cfg.TLSKey = p.tlsKey
	}
	if fl.Changed("tls-client-ca") {
		cfg.TLSClientCA = p.tlsClientCA
	}
	if fl.Changed("proto-descriptor-set") {
		cfg.ProtoDescriptorSet = p.descriptorSet
	}
	if fl.Changed("max-concurrent-streams") {
		cfg.MaxConcurrentStreams = p.maxStreams
	}
	if fl.Changed("grpc-streams") {
		cfg.GRPCStreams = idemproxy.GRPCStreams(p.grpcStreams)
	}
}

package idemproxy

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// rpcDescriptors are the services of Config.ProtoDescriptorSet: with
// them, idem serve reads request messages (their AIP-155 request_id and
// AEP-155 idempotency_key fields, their canonical fingerprint) and tells
// streaming methods from unary ones. Without (a nil *rpcDescriptors), it
// reads messages as bytes.
type rpcDescriptors struct {
	files *protoregistry.Files
	types *dynamicpb.Types
	// registry holds a dynamic type of every message in files, for
	// the fingerprint's reading of google.protobuf.Any.
	registry *protoregistry.Types
}

// LoadDescriptorSet reads a FileDescriptorSet (protoc --include_imports
// --descriptor_set_out, or buf build -o) and checks that its files link.
func LoadDescriptorSet(path string) (*protoregistry.Files, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("proto_descriptor_set: %w", err)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(b, &set); err != nil {
		return nil, fmt.Errorf("proto_descriptor_set %s: not a FileDescriptorSet: %w", path, err)
	}
	files, err := protodesc.NewFiles(&set)
	if err != nil {
		return nil, fmt.Errorf("proto_descriptor_set %s: %w (build it with --include_imports)", path, err)
	}
	return files, nil
}

func newRPCDescriptors(files *protoregistry.Files) *rpcDescriptors {
	if files == nil {
		return nil
	}
	reg := new(protoregistry.Types)
	var walk func(protoreflect.MessageDescriptors)
	walk = func(ms protoreflect.MessageDescriptors) {
		for i := range ms.Len() {
			md := ms.Get(i)
			_ = reg.RegisterMessage(dynamicpb.NewMessageType(md))
			walk(md.Messages())
		}
	}
	files.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		walk(fd.Messages())
		return true
	})
	return &rpcDescriptors{files: files, types: dynamicpb.NewTypes(files), registry: reg}
}

// method returns the descriptor of the method at path
// ("/pkg.Service/Method"), or nil.
func (d *rpcDescriptors) method(path string) protoreflect.MethodDescriptor {
	if d == nil {
		return nil
	}
	svc, m, ok := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	if !ok || !strings.HasPrefix(path, "/") {
		return nil
	}
	desc, err := d.files.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil
	}
	sd, ok := desc.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil
	}
	return sd.Methods().ByName(protoreflect.Name(m))
}

// rpcMetrics are the metrics of gRPC calls beside the outcome counter.
type rpcMetrics struct {
	streamKeys *prometheus.CounterVec
}

func newRPCMetrics(m *Metrics) *rpcMetrics {
	if m == nil {
		return nil
	}
	rm := &rpcMetrics{streamKeys: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_proxy_grpc_streaming_keys_total",
		Help: "Streaming gRPC calls that carried an idempotency key, by route: idem protects unary calls only, so these passed unprotected (or were refused, with grpc_streams: refuse).",
	}, []string{"route"})}
	if err := m.Registry.Register(rm.streamKeys); err != nil {
		if are, ok := err.(prometheus.AlreadyRegisteredError); ok {
			rm.streamKeys = are.ExistingCollector.(*prometheus.CounterVec)
		}
	}
	return rm
}

// SchemeH2C is the upstream URL scheme of a cleartext HTTP/2 upstream
// (h2c with prior knowledge), how gRPC servers usually listen:
// --upstream h2c://orders:50051.
const SchemeH2C = "h2c"

// useH2C makes tr speak HTTP/2 with prior knowledge, over cleartext, only.
func useH2C(tr *http.Transport) {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr.Protocols = &p
}

// setUpRPC reads cfg's descriptor set and sets up the gRPC calls' metrics;
// an h2c upstream is then addressed as http (the transport speaks h2c).
func (p *Proxy) setUpRPC(cfg Config, up *url.URL) error {
	if up.Scheme == SchemeH2C {
		up.Scheme = "http"
	}
	if cfg.ProtoDescriptorSet != "" {
		files, err := LoadDescriptorSet(cfg.ProtoDescriptorSet)
		if err != nil {
			return err
		}
		p.rpcDesc = newRPCDescriptors(files)
	}
	p.rpcMetrics = newRPCMetrics(p.metrics)
	return nil
}

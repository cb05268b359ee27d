package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/rpccore"
)

// UnaryServerInterceptor returns a gRPC unary server interceptor that runs
// each protected call at most once per key and replays its answer to every
// retry (see the package documentation). It panics on an invalid
// configuration; use NewUnaryServerInterceptor to get the error instead.
//
// Put it after interceptors that authenticate the call (its Scope reads
// what they established) and before those that recover panics or log
// (they then see replays and idem's own errors).
func UnaryServerInterceptor(e *idem.Engine, cfg Config) grpc.UnaryServerInterceptor {
	i, err := NewUnaryServerInterceptor(e, cfg)
	if err != nil {
		panic(err)
	}
	return i
}

// NewUnaryServerInterceptor is UnaryServerInterceptor, returning
// configuration errors: no engine, no Scope, a method in Methods or Require
// that is not a unary method of a service in the protobuf registry (a
// streaming method, a typo), a negative duration.
func NewUnaryServerInterceptor(e *idem.Engine, cfg Config) (grpc.UnaryServerInterceptor, error) {
	srv, err := rpccore.New(e, cfg.options())
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: %w", err)
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		msg, ok := req.(proto.Message)
		if !ok { // not protobuf: nothing to fingerprint
			return handler(ctx, req)
		}
		call := rpccore.Call{Method: info.FullMethod, Request: msg, Keys: metadata.ValueFromIncomingContext(ctx, rpccore.MetadataKey)}
		ans := srv.Serve(ctx, &call, func(ctx context.Context) rpccore.Result {
			var rec *recorder
			if idem.LeaseFrom(ctx) != nil { // protected: record the metadata to store
				if sts := grpc.ServerTransportStreamFromContext(ctx); sts != nil {
					rec = &recorder{ServerTransportStream: sts}
					ctx = grpc.NewContextWithServerTransportStream(ctx, rec)
				}
			}
			resp, err := handler(ctx, req)
			r := rpccore.Result{Err: err}
			r.Msg, _ = resp.(proto.Message)
			if rec != nil {
				r.Header, r.Trailer = rec.recorded()
			}
			return r
		})
		if ans.Header != nil {
			_ = grpc.SetHeader(ctx, metadata.MD(ans.Header))
		}
		if ans.Trailer != nil {
			_ = grpc.SetTrailer(ctx, metadata.MD(ans.Trailer))
		}
		if ans.Status != nil {
			if d, ok := rpccore.RetryDelay(ans.Status.Details); ok {
				// grpc's own retry policy waits what the server asks in
				// this trailer (it does not read RetryInfo).
				_ = grpc.SetTrailer(ctx, metadata.Pairs(pushbackKey, strconv.FormatInt(d.Milliseconds(), 10)))
			}
			return nil, status.ErrorProto(ans.Status)
		}
		if ans.Msg == nil {
			return nil, ans.Err
		}
		return ans.Msg, ans.Err
	}, nil
}

// pushbackKey is the trailer in which a server tells a client's gRPC
// retry policy how long to wait before its next attempt (gRFC A6).
const pushbackKey = "grpc-retry-pushback-ms"

// statusOf is the status grpc-go sends for a handler's error, as grpc-go
// makes it (status.FromError, then a context error's code): for an error
// that wraps a status, its code and details with the whole error's text,
// so that a replay carries exactly what the first call answered. A mark of
// idem.Retryable or idem.Ambiguous is taken off first: it says what became
// of the key, not what to answer (and such an answer is never stored).
func statusOf(err error) (*spb.Status, bool) {
	for idem.FailureMark(err) != idem.Unmarked {
		u := errors.Unwrap(err)
		if u == nil {
			break
		}
		err = u
	}
	if s, ok := status.FromError(err); ok {
		return s.Proto(), true
	}
	s := status.FromContextError(err)
	return s.Proto(), errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// recorder passes a protected handler's metadata on, and keeps a copy to
// store with its answer. (grpc.SetSendCompressor needs grpc's own stream,
// so it fails in a protected handler.)
type recorder struct {
	grpc.ServerTransportStream
	mu              sync.Mutex
	header, trailer rpccore.MD
}

func (r *recorder) SetHeader(md metadata.MD) error {
	err := r.ServerTransportStream.SetHeader(md)
	if err == nil {
		r.add(&r.header, md)
	}
	return err
}

func (r *recorder) SendHeader(md metadata.MD) error {
	err := r.ServerTransportStream.SendHeader(md)
	if err == nil {
		r.add(&r.header, md)
	}
	return err
}

func (r *recorder) SetTrailer(md metadata.MD) error {
	err := r.ServerTransportStream.SetTrailer(md)
	if err == nil {
		r.add(&r.trailer, md)
	}
	return err
}

func (r *recorder) add(to *rpccore.MD, md metadata.MD) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if *to == nil {
		*to = rpccore.MD{}
	}
	for k, vs := range md {
		(*to)[k] = append((*to)[k], vs...)
	}
}

func (r *recorder) recorded() (header, trailer rpccore.MD) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.header, r.trailer
}

// Response returns the stored form of msg, the answer of a protected
// method: what a handler passes to its store's CompleteTx, inside its own
// transaction, so that the answer commits with the business change:
//
//	resp, err := idemgrpc.Response(payment)
//	...
//	err = store.CompleteTx(ctx, tx, idem.LeaseFrom(ctx), resp)
//
// Every retry then gets msg back. A Resolver settling a key of a gRPC
// method completes it with a Response too.
func Response(msg proto.Message) (*idem.Response, error) {
	if msg == nil {
		return nil, errors.New("idemgrpc: Response needs a message")
	}
	return rpccore.Encode(msg, nil, nil, nil, nil)
}

// StatusResponse returns the stored form of a status answer, for a
// Resolver that settles a key of a gRPC method with an error.
func StatusResponse(st *status.Status) (*idem.Response, error) {
	if st.Code() == 0 {
		return nil, errors.New("idemgrpc: StatusResponse needs an error status")
	}
	return rpccore.Encode(nil, st.Proto(), nil, nil, nil)
}

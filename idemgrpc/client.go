package idemgrpc

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemclient"
	"github.com/idem-dev/idem/internal/rpccore"
)

// ClientConfig configures the client interceptor. The zero value works.
type ClientConfig struct {
	// Methods are the protected methods, by full name
	// ("/pkg.Service/Method"), besides those whose request message has a
	// string request_id or an idempotency_key field. Defaults to none.
	Methods []string

	// IgnoreKeyFields protects only the methods in Methods, and calls given
	// a key with WithKey. Defaults to false.
	IgnoreKeyFields bool

	// NewKey makes the key of a call that has none. Defaults to
	// idemclient.NewKey (a UUIDv7, which a request_id accepts).
	NewKey func() string

	// MaxAttempts bounds how many times one call is sent, the first
	// included; 1 turns the interceptor's retries off (grpc's own retry
	// policy still resends the same key). Defaults to 4.
	MaxAttempts int

	// MaxElapsed bounds the time from the first attempt after which no
	// wait begins. Defaults to one minute.
	MaxElapsed time.Duration

	// BaseDelay bounds the first backoff after UNAVAILABLE without a
	// RetryInfo; each later one doubles the bound (full jitter). Defaults
	// to 100ms.
	BaseDelay time.Duration

	// MaxDelay caps the backoff. A server's RetryInfo is honoured even when
	// longer, within MaxElapsed and the call's deadline. Defaults to 10s.
	MaxDelay time.Duration

	// Logger receives a debug record for each retry. Keys are never
	// logged. Defaults to slog.Default().
	Logger *slog.Logger

	retry rpccore.Retry // test hooks: fake time
}

// CallInfo is what became of one call, reported through WithCallInfo.
type CallInfo struct {
	// Key is the key the call was sent with ("" when unprotected).
	Key string
	// Attempts is how many times the interceptor sent it (grpc's own
	// retries under one attempt are not counted).
	Attempts int
	// Replayed reports that the answer is a replay of an earlier
	// attempt's (the idempotent-replayed header metadata).
	Replayed bool
}

// WithKey sets the key of one call: make it once per logical operation,
// keep it with the operation, and pass it on every try, also across
// restarts of the client. It protects the call whatever its method.
func WithKey(key string) grpc.CallOption { return keyOption{key: key} }

// WithCallInfo makes the interceptor fill info in when the call returns.
func WithCallInfo(info *CallInfo) grpc.CallOption { return infoOption{info: info} }

type keyOption struct {
	grpc.EmptyCallOption
	key string
}

type infoOption struct {
	grpc.EmptyCallOption
	info *CallInfo
}

// UnaryClientInterceptor returns a gRPC unary client interceptor that gives
// each call of a protected method one key and keeps it across every retry:
// its own retries of UNAVAILABLE and of ABORTED with RetryInfo (a call in
// flight), and grpc's retries under a service config's retry policy, which
// resend the message and metadata it sent. The key goes in the request's
// key field when the message has one and it is empty (on a copy: the
// caller's message is left as it is), else in the idempotency-key metadata.
// It panics on an invalid configuration; use NewUnaryClientInterceptor to
// get the error instead.
func UnaryClientInterceptor(cfg ClientConfig) grpc.UnaryClientInterceptor {
	i, err := NewUnaryClientInterceptor(cfg)
	if err != nil {
		panic(err)
	}
	return i
}

// NewUnaryClientInterceptor is UnaryClientInterceptor, returning
// configuration errors.
func NewUnaryClientInterceptor(cfg ClientConfig) (grpc.UnaryClientInterceptor, error) {
	retry := cfg.retry
	retry.MaxAttempts, retry.MaxElapsed, retry.BaseDelay, retry.MaxDelay = cfg.MaxAttempts, cfg.MaxElapsed, cfg.BaseDelay, cfg.MaxDelay
	if err := retry.Validate(); err != nil {
		return nil, fmt.Errorf("idemgrpc: %w", err)
	}
	retry = retry.WithDefaults()
	newKey := cfg.NewKey
	if newKey == nil {
		newKey = idemclient.NewKey
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	methods := slices.Clone(cfg.Methods)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		var (
			key  string
			info *CallInfo
			rest = make([]grpc.CallOption, 0, len(opts)+2)
		)
		for _, o := range opts {
			switch o := o.(type) {
			case keyOption:
				key = o.key
			case infoOption:
				info = o.info
			default:
				rest = append(rest, o)
			}
		}
		msg, _ := req.(proto.Message)
		var fields *rpccore.KeyFields
		if msg != nil && !cfg.IgnoreKeyFields {
			fields = rpccore.KeyFieldsOf(msg.ProtoReflect().Descriptor())
		}
		if key == "" && !slices.Contains(methods, method) && (fields == nil || !fields.Any()) {
			return invoker(ctx, method, req, reply, cc, rest...)
		}
		send, ctx, key, err := placeKey(ctx, msg, req, fields, key, newKey)
		if err != nil {
			return err
		}
		var header, trailer metadata.MD
		rest = append(rest, grpc.Header(&header), grpc.Trailer(&trailer))
		n, err := retry.Do(ctx, func() (*spb.Status, error) {
			header, trailer = nil, nil
			err := invoker(ctx, method, send, reply, cc, rest...)
			if err == nil {
				return nil, nil
			}
			st := status.Convert(err)
			logger.LogAttrs(ctx, slog.LevelDebug, "idemgrpc: attempt failed", slog.String("method", method), slog.String("code", st.Code().String()))
			return st.Proto(), err
		})
		if info != nil {
			*info = CallInfo{Key: key, Attempts: n, Replayed: Replayed(header) || Replayed(trailer)}
		}
		return err
	}, nil
}

// placeKey chooses the call's key and puts it where the server reads it:
// the key given with WithKey, or the one already in the request's key
// field or in the metadata, or a new one; into the empty key field of a
// copy of the request, or else into the metadata; and into the metadata
// too when it is in a key field.
func placeKey(ctx context.Context, msg proto.Message, req any, fields *rpccore.KeyFields, key string, newKey func() string) (any, context.Context, string, error) {
	inMsg := ""
	if fields != nil && fields.Any() {
		inMsg = rpccore.KeyIn(msg, fields)
	}
	inMD := metadata.ValueFromOutgoingContext(ctx, rpccore.MetadataKey)
	for _, k := range append([]string{inMsg}, inMD...) {
		switch {
		case k == "":
		case key == "":
			key = k
		case !rpccore.SameKey(k, key):
			return nil, ctx, "", status.Errorf(codes.InvalidArgument, "idemgrpc: the call carries two different keys (from WithKey, the request's key field and the %s metadata); send one", rpccore.MetadataKey)
		}
	}
	if key == "" {
		key = newKey()
	}
	if err := idem.ValidateKey(key); err != nil {
		return nil, ctx, "", status.Errorf(codes.InvalidArgument, "idemgrpc: %v", err)
	}
	toField := inMsg == "" && len(inMD) == 0 && fields != nil && fields.Any()
	if len(inMD) == 0 && (inMetadata(key) || inMsg == "" && !toField) {
		// The key goes in the metadata also when it is in a key field: a
		// server that ignores key fields (IgnoreKeyFields) and does not
		// list the method would otherwise see no key, and run every retry.
		ctx = metadata.AppendToOutgoingContext(ctx, rpccore.MetadataKey, key)
	}
	switch {
	case inMsg != "" && rpccore.NeedsFirstSent(msg, fields):
		// An AEP-155 key without its first_sent would be refused: the
		// first attempt is this one.
		c := proto.Clone(msg)
		rpccore.SetKey(c, fields, inMsg, time.Now())
		return c, ctx, key, nil
	case toField:
		c := proto.Clone(msg)
		rpccore.SetKey(c, fields, key, time.Now())
		return c, ctx, key, nil
	}
	return req, ctx, key, nil // the server reads it where it is
}

// inMetadata reports whether key reads back as itself from the metadata
// (a key with a comma, or in quotes, would not).
func inMetadata(key string) bool {
	k, err := idem.ParseKeyHeader([]string{key})
	return err == nil && k == key
}

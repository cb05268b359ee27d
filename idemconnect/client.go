package idemconnect

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"time"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemclient"
	"github.com/idem-dev/idem/internal/rpccore"
)

// ClientConfig configures the client side; its fields mean what
// idemgrpc.ClientConfig's do. The zero value works.
type ClientConfig struct {
	// Methods are protected procedures, besides those whose request message
	// has a key field. Defaults to none.
	Methods []string
	// IgnoreKeyFields protects only Methods and calls given a key with
	// WithKey. Defaults to false.
	IgnoreKeyFields bool
	// NewKey makes the key of a call that has none. Defaults to
	// idemclient.NewKey (a UUIDv7).
	NewKey func() string
	// MaxAttempts bounds how many times one call is sent. Defaults to 4.
	MaxAttempts int
	// MaxElapsed bounds the time after which no wait begins. Defaults to
	// one minute.
	MaxElapsed time.Duration
	// BaseDelay bounds the first backoff after UNAVAILABLE. Defaults to
	// 100ms.
	BaseDelay time.Duration
	// MaxDelay caps the backoff. Defaults to 10s.
	MaxDelay time.Duration

	retry rpccore.Retry // test hooks
}

// CallInfo is what became of one call, reported through WithCallInfo.
type CallInfo struct {
	Key      string
	Attempts int
	Replayed bool
}

type keyCtx struct{}
type infoCtx struct{}

// WithKey returns ctx giving the calls made with it the key: make it once
// per logical operation and pass it on every try.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtx{}, key)
}

// WithCallInfo returns ctx making the interceptor fill info in when a
// call made with it returns.
func WithCallInfo(ctx context.Context, info *CallInfo) context.Context {
	return context.WithValue(ctx, infoCtx{}, info)
}

// NewClientInterceptor returns a connect.Interceptor for clients that gives
// each call of a protected procedure one key and keeps it across its
// retries of UNAVAILABLE and of ABORTED with RetryInfo. The key is the one
// given with WithKey, or already in the request's key field or its
// Idempotency-Key header, or a new one, sent in the Idempotency-Key header
// (connect gives an interceptor no way to change the request message
// without changing the caller's). On a handler it passes calls through.
func NewClientInterceptor(cfg ClientConfig) (connect.Interceptor, error) {
	retry := cfg.retry
	retry.MaxAttempts, retry.MaxElapsed, retry.BaseDelay, retry.MaxDelay = cfg.MaxAttempts, cfg.MaxElapsed, cfg.BaseDelay, cfg.MaxDelay
	if err := retry.Validate(); err != nil {
		return nil, fmt.Errorf("idemconnect: %w", err)
	}
	retry = retry.WithDefaults()
	newKey := cfg.NewKey
	if newKey == nil {
		newKey = idemclient.NewKey
	}
	methods := slices.Clone(cfg.Methods)
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if !req.Spec().IsClient {
				return next(ctx, req)
			}
			key, _ := ctx.Value(keyCtx{}).(string)
			msg, _ := req.Any().(proto.Message)
			var fields *rpccore.KeyFields
			if msg != nil && !cfg.IgnoreKeyFields {
				fields = rpccore.KeyFieldsOf(msg.ProtoReflect().Descriptor())
			}
			if key == "" && !slices.Contains(methods, req.Spec().Procedure) && (fields == nil || !fields.Any()) {
				return next(ctx, req)
			}
			for _, k := range []string{keyIn(msg, fields), req.Header().Get(idem.HeaderName)} {
				switch {
				case k == "":
				case key == "":
					key = k
				case !rpccore.SameKey(k, key):
					return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("idemconnect: the call carries two different keys (from WithKey, the request's key field and the Idempotency-Key header); send one"))
				}
			}
			if key == "" {
				key = newKey()
			}
			if err := idem.ValidateKey(key); err != nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, err)
			}
			if req.Header().Get(idem.HeaderName) == "" {
				if k, err := idem.ParseKeyHeader([]string{key}); keyIn(msg, fields) == "" || err == nil && k == key {
					// In the header also when it is in a key field: a
					// server that ignores key fields and does not list the
					// procedure would otherwise see no key, and run every
					// retry.
					req.Header().Set(idem.HeaderName, key)
				}
			}
			if restore := fillFirstSent(req, msg, fields); restore != nil {
				defer restore()
			}
			var res connect.AnyResponse
			var meta http.Header
			n, err := retry.Do(ctx, func() (*spb.Status, error) {
				var err error
				res, err = next(ctx, req)
				if err == nil {
					meta = res.Header()
					return nil, nil
				}
				st, _ := statusOf(err)
				var ce *connect.Error
				if errors.As(err, &ce) {
					meta = ce.Meta()
				}
				return st, err
			})
			if info, ok := ctx.Value(infoCtx{}).(*CallInfo); ok {
				*info = CallInfo{Key: key, Attempts: n, Replayed: Replayed(meta)}
			}
			return res, err
		}
	}), nil
}

// fillFirstSent gives an AEP-155 key that came without its first_sent
// (which the server would refuse) one, now: the first attempt is this
// one. The caller's message is left untouched: the request carries a copy
// for the call's attempts, and restore puts the caller's message back.
func fillFirstSent(req connect.AnyRequest, msg proto.Message, f *rpccore.KeyFields) (restore func()) {
	k := keyIn(msg, f)
	if k == "" || !rpccore.NeedsFirstSent(msg, f) {
		return nil
	}
	v := reflect.ValueOf(req)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return nil
	}
	field := v.Elem().FieldByName("Msg") // *connect.Request[T]'s
	c := proto.Clone(msg)
	if !field.IsValid() || !field.CanSet() || !reflect.TypeOf(c).AssignableTo(field.Type()) {
		return nil
	}
	rpccore.SetKey(c, f, k, time.Now())
	old := field.Interface()
	field.Set(reflect.ValueOf(c))
	return func() { field.Set(reflect.ValueOf(old)) }
}

func keyIn(msg proto.Message, f *rpccore.KeyFields) string {
	if msg == nil || f == nil || !f.Any() {
		return ""
	}
	return rpccore.KeyIn(msg, f)
}

// The google.rpc.ErrorInfo reasons of the errors idem answers (see
// idemgrpc's constants and docs/grpc.md).
const (
	ReasonKeyMissing       = rpccore.ReasonKeyMissing
	ReasonKeyInvalid       = rpccore.ReasonKeyInvalid
	ReasonKeyReused        = rpccore.ReasonKeyReused
	ReasonInFlight         = rpccore.ReasonInFlight
	ReasonNeedsReview      = rpccore.ReasonNeedsReview
	ReasonNotReplayable    = rpccore.ReasonNotReplayable
	ReasonScopeMissing     = rpccore.ReasonScopeMissing
	ReasonScopeDenied      = rpccore.ReasonScopeDenied
	ReasonStoreUnavailable = rpccore.ReasonStoreUnavailable
	// ReasonMethodUnprotected: a key sent to a procedure the server does
	// not protect (Config.RefuseUnlistedKeys).
	ReasonMethodUnprotected = rpccore.ReasonMethodUnprotected
)

// Reason returns the ErrorInfo reason of err when idem answered it, or "".
func Reason(err error) string {
	if err == nil {
		return ""
	}
	st, ok := statusOf(err)
	if !ok {
		return ""
	}
	if info := rpccore.ErrorInfo(st.Details); info != nil {
		return info.Reason
	}
	return ""
}

// NeedsReview reports whether err says that an earlier call with the key
// ended with an unknown outcome and waits for review.
func NeedsReview(err error) bool { return Reason(err) == ReasonNeedsReview }

// Replayed reports whether h, a response's header (or an error's Meta),
// says that the answer is a replay.
func Replayed(h http.Header) bool { return h.Get(rpccore.HeaderReplayed) == "true" }

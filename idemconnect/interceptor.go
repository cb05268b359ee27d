package idemconnect

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/rpccore"
)

// NewInterceptor returns a connect.Interceptor for handlers that runs each
// protected unary call at most once per key and replays its answer to every
// retry (see the package documentation). It fails on an invalid
// configuration: no engine, no Scope, a procedure in Methods or Require
// that is not a unary method of a service in the protobuf registry.
//
// It acts on handlers only; on a client it passes calls through (use
// NewClientInterceptor there). Streaming calls pass through unprotected.
func NewInterceptor(e *idem.Engine, cfg Config) (connect.Interceptor, error) {
	srv, err := rpccore.New(e, cfg.options())
	if err != nil {
		return nil, fmt.Errorf("idemconnect: %w", err)
	}
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			spec := req.Spec()
			msg, ok := req.Any().(proto.Message)
			if spec.IsClient || !ok {
				return next(ctx, req)
			}
			desc, _ := spec.Schema.(protoreflect.MethodDescriptor)
			call := rpccore.Call{Method: spec.Procedure, Desc: desc, Request: msg, Keys: req.Header().Values(idem.HeaderName)}
			var res connect.AnyResponse
			ran := false
			ans := srv.Serve(ctx, &call, func(ctx context.Context) rpccore.Result {
				var err error
				res, err = next(ctx, req)
				ran = true
				out := rpccore.Result{Err: err, Header: rpccore.MD{}, Trailer: rpccore.MD{}}
				if res != nil {
					out.Msg, _ = res.Any().(proto.Message)
					addMD(out.Header, res.Header())
					addMD(out.Trailer, res.Trailer())
				}
				var ce *connect.Error
				if errors.As(err, &ce) {
					addMD(out.Header, ce.Meta())
				}
				if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
					addMD(out.Header, info.ResponseHeader())
					addMD(out.Trailer, info.ResponseTrailer())
				}
				return out
			})
			if ans.Header != nil || ans.Trailer != nil {
				if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
					putMD(info.ResponseHeader(), ans.Header)
					putMD(info.ResponseTrailer(), ans.Trailer)
				}
			}
			switch {
			case ans.Status != nil:
				return nil, connectError(ans.Status)
			case ran:
				if ans.Err != nil {
					return nil, ans.Err
				}
				return res, nil
			case ans.Msg != nil:
				return &replayed{Response: connect.NewResponse(&struct{}{}), msg: ans.Msg}, nil
			}
			return nil, ans.Err
		}
	}), nil
}

// replayed is a stored message sent again. It embeds a connect.Response
// for the methods connect's AnyResponse requires (connect builds its typed
// responses in generated code, which a replay cannot call), and gives the
// stored message as Any, which is what connect sends.
type replayed struct {
	*connect.Response[struct{}]
	msg proto.Message
}

func (r *replayed) Any() any { return r.msg }

// statusOf is the status connect sends for a handler's error.
func statusOf(err error) (*spb.Status, bool) {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		switch {
		case errors.Is(err, context.Canceled):
			ce = connect.NewError(connect.CodeCanceled, err)
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
			// connect sends a net deadline (a dial's) as DEADLINE_EXCEEDED too
			ce = connect.NewError(connect.CodeDeadlineExceeded, err)
		default:
			return &spb.Status{Code: int32(connect.CodeUnknown), Message: err.Error()}, false
		}
	}
	st := &spb.Status{Code: int32(ce.Code()), Message: ce.Message()}
	for _, d := range ce.Details() {
		st.Details = append(st.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
	}
	return st, true
}

// connectError is st as a *connect.Error, details included.
func connectError(st *spb.Status) *connect.Error {
	ce := connect.NewWireError(connect.Code(st.Code), errors.New(st.Message))
	for _, a := range st.Details {
		if d, err := connect.NewErrorDetail(a); err == nil {
			ce.AddDetail(d)
		}
	}
	return ce
}

// addMD adds HTTP headers to md, in gRPC's form: lower-case names, -bin
// values decoded.
func addMD(md rpccore.MD, h http.Header) {
	for name, vs := range h {
		k := strings.ToLower(name)
		if strings.HasSuffix(k, "-bin") {
			dec := make([]string, 0, len(vs))
			for _, v := range vs {
				if b, err := connect.DecodeBinaryHeader(v); err == nil {
					dec = append(dec, string(b))
				}
			}
			vs = dec
		}
		md[k] = append(md[k], vs...)
	}
}

// putMD sets md's values in HTTP headers, -bin values encoded.
func putMD(h http.Header, md rpccore.MD) {
	for k, vs := range md {
		for _, v := range vs {
			if strings.HasSuffix(k, "-bin") {
				v = connect.EncodeBinaryHeader([]byte(v))
			}
			h.Add(k, v)
		}
	}
}

// Response returns the stored form of msg, for a store's CompleteTx inside
// a handler's own transaction (see idemgrpc.Response; the forms are one).
func Response(msg proto.Message) (*idem.Response, error) {
	if msg == nil {
		return nil, errors.New("idemconnect: Response needs a message")
	}
	return rpccore.Encode(msg, nil, nil, nil, nil)
}

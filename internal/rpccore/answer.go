package rpccore

import (
	"encoding/base64"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idem-dev/idem"
)

// MD is metadata as gRPC has it (metadata.MD's layout): lower-case names,
// and the raw bytes of -bin values.
type MD map[string][]string

// A stored RPC answer is an idem.Response:
//
//   - Header "Grpc-Status": the status code, "0" for a message;
//   - Body: the response message (code 0) or the google.rpc.Status
//     (code, message, details), in protobuf's binary encoding;
//   - Header "Content-Type": application/protobuf, with the message's
//     full name as its proto parameter, for operators;
//   - Header "Grpc-Metadata-<name>" and "Grpc-Trailer-<name>": the header
//     and trailer metadata the handler set (-bin values in base64);
//   - Status: the HTTP status that Google's mapping gives the code (200
//     for a message), so that the review page and the admin API show a
//     familiar one.
//
// An answer stored by someone else (an operator or a resolver settling a
// key through the admin API) has no Grpc-Status header; it is replayed as
// Decode says.
const (
	hdrStatus      = "Grpc-Status"
	hdrContentType = "Content-Type"
	prefixHeader   = "Grpc-Metadata-"
	prefixTrailer  = "Grpc-Trailer-"
	ctProtobuf     = "application/protobuf"
)

// Encode returns the stored form of an answer: msg when st is nil, else
// the status st, with the metadata header and trailer (less what keep
// refuses; nil keeps none).
func Encode(msg proto.Message, st *spb.Status, header, trailer MD, keep func(string) bool) (*idem.Response, error) {
	return encode(msg, st, header, trailer, keep, false)
}

// encode is Encode. With shared, the answer's Header, when it has only the
// status and the content type (a message, no metadata), is one map shared
// by every answer of the message's type: what lease.Complete is given,
// which neither it nor any store changes (stores copy or encode what they
// keep). Encode, whose Response callers may change, never shares it.
func encode(msg proto.Message, st *spb.Status, header, trailer MD, keep func(string) bool, shared bool) (*idem.Response, error) {
	var (
		body []byte
		err  error
		name protoreflect.FullName
		c    = code.Code(st.GetCode())
	)
	if st == nil {
		body, err = proto.MarshalOptions{Deterministic: true}.Marshal(msg)
		name = msg.ProtoReflect().Descriptor().FullName()
	} else {
		body, err = proto.Marshal(st)
		name = "google.rpc.Status"
	}
	if err != nil {
		return nil, fmt.Errorf("rpccore: encoding the answer: %w", err)
	}
	if shared && st == nil && len(header) == 0 && len(trailer) == 0 {
		return &idem.Response{Status: HTTPStatus(c), Header: messageHeader(name), Body: body}, nil
	}
	h := newHeader(c, name)
	putMD(h, prefixHeader, header, keep)
	putMD(h, prefixTrailer, trailer, keep)
	return &idem.Response{Status: HTTPStatus(c), Header: h, Body: body}, nil
}

// newHeader returns the stored header of an answer of code c and type
// name, without metadata.
func newHeader(c code.Code, name protoreflect.FullName) http.Header {
	vs := make([]string, 2) // one allocation for both values
	vs[0], vs[1] = strconv.Itoa(int(c)), contentType(name)
	return http.Header{hdrStatus: vs[0:1:1], hdrContentType: vs[1:2:2]}
}

var (
	contentTypes   sync.Map // protoreflect.FullName → string
	messageHeaders sync.Map // protoreflect.FullName → http.Header, never changed
)

// contentType is the stored Content-Type of an answer of type name, made
// once per type.
func contentType(name protoreflect.FullName) string {
	if ct, ok := contentTypes.Load(name); ok {
		return ct.(string)
	}
	ct := ctProtobuf + "; proto=" + string(name)
	contentTypes.Store(name, ct)
	return ct
}

// messageHeader is the stored header of a message answer of type name
// without metadata, made once per type and shared: nobody may change it.
func messageHeader(name protoreflect.FullName) http.Header {
	if h, ok := messageHeaders.Load(name); ok {
		return h.(http.Header)
	}
	h, _ := messageHeaders.LoadOrStore(name, newHeader(code.Code_OK, name))
	return h.(http.Header)
}

func putMD(h http.Header, prefix string, md MD, keep func(string) bool) {
	for name, vs := range md {
		name = strings.ToLower(name)
		if len(vs) == 0 || keep == nil || !keep(name) {
			continue
		}
		if strings.HasSuffix(name, "-bin") {
			enc := make([]string, len(vs))
			for i, v := range vs {
				enc[i] = base64.StdEncoding.EncodeToString([]byte(v))
			}
			vs = enc
		}
		h[prefix+name] = append(h[prefix+name], vs...)
	}
}

// NotReplayableMetadata is the NotReplayable reason of an answer whose
// metadata took it over EngineConfig.MaxResponseBody.
const NotReplayableMetadata = "metadata_too_large"

// metadataSize is how many bytes of a stored answer are the handler's
// metadata (names and values).
func metadataSize(resp *idem.Response) int {
	n := 0
	for name, vs := range resp.Header {
		if !strings.HasPrefix(name, prefixHeader) && !strings.HasPrefix(name, prefixTrailer) {
			continue
		}
		for _, v := range vs {
			n += len(name) + len(v)
		}
	}
	return n
}

// Reply is a stored answer, ready to send again: the message, or the
// status when Status is not nil, and the metadata.
type Reply struct {
	Msg             proto.Message
	Status          *spb.Status
	Header, Trailer MD
}

// Decode reads a stored answer for a method whose response messages are
// of type out. An answer stored by the front doors is sent as it was. One
// stored by an operator or a resolver is read as an HTTP answer: a 2xx with
// a JSON body is the response message in protobuf's JSON form, with a
// protobuf body (application/protobuf, application/x-protobuf) its binary
// form, with no body an empty message; any other status is a status of
// the code Google's mapping gives it, its body the message.
func Decode(resp *idem.Response, out protoreflect.MessageType) (Reply, error) {
	var r Reply
	r.Header, r.Trailer = getMD(resp.Header, prefixHeader), getMD(resp.Header, prefixTrailer)
	if v := resp.Header[hdrStatus]; len(v) > 0 {
		c, err := strconv.ParseUint(v[0], 10, 32)
		if err != nil {
			return Reply{}, fmt.Errorf("rpccore: stored status %q: %w", v[0], err)
		}
		if c != 0 {
			r.Status = new(spb.Status)
			if err := proto.Unmarshal(resp.Body, r.Status); err != nil {
				return Reply{}, fmt.Errorf("rpccore: decoding the stored status: %w", err)
			}
			r.Status.Code = int32(c)
			return r, nil
		}
		r.Msg = out.New().Interface()
		if err := proto.Unmarshal(resp.Body, r.Msg); err != nil {
			return Reply{}, fmt.Errorf("rpccore: decoding the stored %s: %w", out.Descriptor().FullName(), err)
		}
		return r, nil
	}
	if resp.Status < 200 || resp.Status > 299 {
		msg := strings.TrimSpace(string(resp.Body))
		if len(msg) > 1024 {
			msg = msg[:1024]
		}
		r.Status = &spb.Status{Code: int32(CodeOf(resp.Status)), Message: msg}
		return r, nil
	}
	r.Msg = out.New().Interface()
	if len(resp.Body) == 0 {
		return r, nil
	}
	mt, _, _ := mime.ParseMediaType(firstValue(resp.Header[hdrContentType]))
	var err error
	switch {
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		err = protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(resp.Body, r.Msg)
	case mt == ctProtobuf || mt == "application/x-protobuf" || mt == "application/octet-stream":
		err = proto.Unmarshal(resp.Body, r.Msg)
	default:
		err = fmt.Errorf("content type %q is neither JSON nor protobuf", mt)
	}
	if err != nil {
		return Reply{}, fmt.Errorf("rpccore: the stored answer is not a %s: %w", out.Descriptor().FullName(), err)
	}
	return r, nil
}

func getMD(h http.Header, prefix string) MD {
	var md MD
	for name, vs := range h {
		if len(name) <= len(prefix) || !strings.EqualFold(name[:len(prefix)], prefix) {
			continue
		}
		k := strings.ToLower(name[len(prefix):])
		if strings.HasSuffix(k, "-bin") {
			dec := make([]string, 0, len(vs))
			for _, v := range vs {
				if b, err := base64.StdEncoding.DecodeString(v); err == nil {
					dec = append(dec, string(b))
				}
			}
			vs = dec
		}
		if md == nil {
			md = make(MD)
		}
		md[k] = append(md[k], vs...)
	}
	return md
}

func firstValue(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

// HTTPStatus is the HTTP status Google's error model maps c to.
func HTTPStatus(c code.Code) int {
	switch c {
	case code.Code_OK:
		return http.StatusOK
	case code.Code_CANCELLED:
		return 499
	case code.Code_INVALID_ARGUMENT, code.Code_FAILED_PRECONDITION, code.Code_OUT_OF_RANGE:
		return http.StatusBadRequest
	case code.Code_DEADLINE_EXCEEDED:
		return http.StatusGatewayTimeout
	case code.Code_NOT_FOUND:
		return http.StatusNotFound
	case code.Code_ALREADY_EXISTS, code.Code_ABORTED:
		return http.StatusConflict
	case code.Code_PERMISSION_DENIED:
		return http.StatusForbidden
	case code.Code_UNAUTHENTICATED:
		return http.StatusUnauthorized
	case code.Code_RESOURCE_EXHAUSTED:
		return http.StatusTooManyRequests
	case code.Code_UNIMPLEMENTED:
		return http.StatusNotImplemented
	case code.Code_UNAVAILABLE:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError // UNKNOWN, INTERNAL, DATA_LOSS, and codes not yet defined
}

// CodeOf is the code Google's error model maps an HTTP status to, for
// answers stored without a code.
func CodeOf(status int) code.Code {
	switch status {
	case http.StatusBadRequest:
		return code.Code_INVALID_ARGUMENT
	case http.StatusUnauthorized:
		return code.Code_UNAUTHENTICATED
	case http.StatusForbidden:
		return code.Code_PERMISSION_DENIED
	case http.StatusNotFound:
		return code.Code_NOT_FOUND
	case http.StatusConflict:
		return code.Code_ABORTED
	case http.StatusTooManyRequests:
		return code.Code_RESOURCE_EXHAUSTED
	case 499:
		return code.Code_CANCELLED
	case http.StatusNotImplemented:
		return code.Code_UNIMPLEMENTED
	case http.StatusServiceUnavailable:
		return code.Code_UNAVAILABLE
	case http.StatusGatewayTimeout:
		return code.Code_DEADLINE_EXCEEDED
	}
	switch {
	case status >= 200 && status < 300:
		return code.Code_OK
	case status >= 400 && status < 500:
		return code.Code_FAILED_PRECONDITION
	}
	return code.Code_INTERNAL
}

// Keep reports whether metadata name may be stored and replayed: not a
// protocol's own (grpc-, connect-, content-*), not one
// that belongs to one response or one connection (date, cookies,
// hop-by-hop), not a credential, not idem's own, and not in drop.
func Keep(name string, drop map[string]bool) bool {
	for i := 0; i < len(name); i++ { // what gRPC allows in a metadata name
		if c := name[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	switch {
	case name == "" || drop[name],
		strings.HasPrefix(name, "grpc-"), strings.HasPrefix(name, "connect-"), strings.HasPrefix(name, "content-"):
		return false
	}
	switch name {
	case "date", "set-cookie", "cookie", "authorization", "proxy-authenticate", "proxy-authorization",
		"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "accept-encoding",
		HeaderReplayed, MetadataKey:
		return false
	}
	return true
}

// HeaderReplayed is the header metadata of every replayed answer.
const HeaderReplayed = "idempotent-replayed"

package idemproxy

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idem-dev/idem/internal/rpccore"
)

// rpcKind is the protocol of a gRPC-family call.
type rpcKind uint8

const (
	rpcNone    rpcKind = iota
	rpcGRPC            // application/grpc, +proto, +json
	rpcWeb             // application/grpc-web, +proto, +json
	rpcConnect         // Connect unary: application/proto or application/json with Connect-Protocol-Version
	rpcStream          // a streaming protocol idem never buffers (Connect streaming, gRPC-Web text)
)

// rpcCall is how a request speaks the gRPC family.
type rpcCall struct {
	kind rpcKind
	// json: the messages are in protobuf's JSON form (the json codec);
	// codec names another codec than proto or json ("" for those two),
	// whose messages idem reads as bytes.
	json  bool
	codec string
	// contentType is the request's media type, which a replay answers in.
	contentType string
	// encoding is the compression of the request's messages: gRPC's
	// grpc-encoding, Connect unary's Content-Encoding.
	encoding string
}

// rpcOf tells whether r is a gRPC, gRPC-Web or Connect call, and how it
// is framed. Any other request is rpcNone, and the HTTP rules apply.
func rpcOf(r *http.Request) rpcCall {
	if r.Method != http.MethodPost {
		return rpcCall{}
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return rpcCall{}
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return rpcCall{}
	}
	c := rpcCall{contentType: mt}
	sub := ""
	switch {
	case mt == "application/grpc" || strings.HasPrefix(mt, "application/grpc+"):
		c.kind, sub = rpcGRPC, strings.TrimPrefix(strings.TrimPrefix(mt, "application/grpc"), "+")
	case mt == "application/grpc-web-text" || strings.HasPrefix(mt, "application/grpc-web-text+"):
		c.kind = rpcStream
		return c
	case mt == "application/grpc-web" || strings.HasPrefix(mt, "application/grpc-web+"):
		c.kind, sub = rpcWeb, strings.TrimPrefix(strings.TrimPrefix(mt, "application/grpc-web"), "+")
	case strings.HasPrefix(mt, "application/connect+"):
		c.kind = rpcStream
		return c
	case (mt == "application/proto" || mt == "application/json") && r.Header.Get("Connect-Protocol-Version") != "":
		c.kind, sub = rpcConnect, strings.TrimPrefix(mt, "application/")
	default:
		return rpcCall{}
	}
	if c.kind == rpcConnect {
		c.encoding = r.Header.Get("Content-Encoding")
	} else {
		c.encoding = r.Header.Get("Grpc-Encoding")
	}
	switch sub {
	case "", "proto":
	case "json":
		c.json = true
	default:
		c.codec = sub
	}
	return c
}

// Message framing: gRPC and gRPC-Web prefix each message with a flags
// byte (compressed, or, in gRPC-Web, trailers) and a 4-byte length.
const (
	flagCompressed = 0x01
	flagTrailer    = 0x80
	prefixLen      = 5
)

// frame is one length-prefixed frame of a gRPC body.
type frame struct {
	flags   byte
	payload []byte
}

// frames splits a gRPC body into its frames.
func frames(b []byte) ([]frame, error) {
	var out []frame
	for len(b) > 0 {
		if len(b) < prefixLen {
			return nil, errors.New("a message prefix is cut short")
		}
		n := binary.BigEndian.Uint32(b[1:prefixLen])
		if uint64(len(b)-prefixLen) < uint64(n) {
			return nil, errors.New("a message is cut short")
		}
		out = append(out, frame{flags: b[0], payload: b[prefixLen : prefixLen+int(n)]})
		b = b[prefixLen+int(n):]
	}
	return out, nil
}

func appendFrame(dst []byte, flags byte, payload []byte) []byte {
	dst = append(dst, flags, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(dst[len(dst)-4:], uint32(len(payload)))
	return append(dst, payload...)
}

// gunzip decompresses b, up to limit bytes.
func gunzip(b []byte, limit int64) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	out, err := io.ReadAll(io.LimitReader(zr, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(out)) > limit {
		return nil, errTooLarge
	}
	return out, nil
}

var errTooLarge = errors.New("the message is larger than the route's max_body once decompressed")

// rpcAnswer is an answer of the gRPC family in a form that does not
// depend on the protocol: what idem stores and replays, in any of the
// three protocols the client speaks.
type rpcAnswer struct {
	// header is the response metadata, trailer the custom trailers (no
	// grpc-status, grpc-message, grpc-status-details-bin): canonical names,
	// -bin values as they travel (base64).
	header, trailer http.Header
	// msg is the response message, when hasMsg (a unary answer has one
	// on success, none on error).
	msg    []byte
	hasMsg bool
	json   bool // msg is in protobuf's JSON form
	// st is the status: code, message and details.
	st *spb.Status
	// httpStatus is the HTTP status of an upstream's answer that was not
	// a gRPC one (a balancer's 503), else 0.
	httpStatus int
}

// Reserved response headers: the protocol's own, set by whoever writes
// the answer, never metadata.
func reservedRPCHeader(name string) bool {
	l := strings.ToLower(name)
	switch l {
	case "content-type", "content-length", "content-encoding", "date", "trailer", "transfer-encoding",
		"connection", "keep-alive", "te", "upgrade", "set-cookie", "accept-encoding",
		"idempotent-replayed", "idempotency-outcome", "vary":
		return true
	}
	return strings.HasPrefix(l, "grpc-") || strings.HasPrefix(l, "connect-") || strings.HasPrefix(l, "trailer-") ||
		strings.HasPrefix(l, "access-control-")
}

// errNoStatus is a gRPC answer that ended without grpc-status: cut short
// after its headers (a reset stream, a lost connection), or not gRPC.
var errNoStatus = errors.New("the upstream's answer carries no grpc-status")

// parseRPCAnswer reads the upstream's answer to a call of c: status,
// header, body and trailers as ReverseProxy passed them on.
func parseRPCAnswer(c rpcCall, status int, h http.Header, body []byte, trailer http.Header, limit int64) (*rpcAnswer, error) {
	a := &rpcAnswer{header: http.Header{}, trailer: http.Header{}, json: c.json}
	for k, vs := range h {
		if !reservedRPCHeader(k) {
			a.header[k] = vs
		}
	}
	if c.kind == rpcConnect {
		return parseConnectAnswer(a, status, h, body, limit)
	}
	if status != http.StatusOK {
		// An HTTP error instead of a gRPC answer (a balancer's 503): the
		// code gRPC clients give it.
		a.st = &spb.Status{Code: int32(grpcCodeOfHTTP(status)), Message: fmt.Sprintf("the upstream answered HTTP %d", status)}
		a.httpStatus = status
		return a, nil
	}
	fs, err := frames(body)
	if err != nil {
		return nil, err
	}
	enc := h.Get("Grpc-Encoding")
	tr := http.Header{}
	for k, vs := range trailer {
		tr[k] = vs
	}
	for _, f := range fs {
		switch {
		case f.flags&flagTrailer != 0 && c.kind == rpcWeb:
			if err := parseWebTrailer(f.payload, tr); err != nil {
				return nil, err
			}
		case a.hasMsg:
			return nil, errManyMessages
		default:
			p := f.payload
			if f.flags&flagCompressed != 0 {
				if !strings.EqualFold(enc, "gzip") {
					return nil, fmt.Errorf("the upstream's answer is compressed with %q, which idem cannot store", enc)
				}
				if p, err = gunzip(p, limit); err != nil {
					return nil, err
				}
			}
			a.msg, a.hasMsg = p, true
		}
	}
	if len(tr) == 0 || tr.Get("Grpc-Status") == "" {
		// Trailers-only: the status came in the headers.
		if h.Get("Grpc-Status") != "" {
			// gRPC clients read the metadata of a trailers-only answer
			// as trailers.
			tr = h
			a.header = http.Header{}
		}
	}
	sv := tr.Get("Grpc-Status")
	if sv == "" {
		return nil, errNoStatus
	}
	n, err := strconv.ParseUint(sv, 10, 31)
	if err != nil {
		return nil, fmt.Errorf("grpc-status %q: %w", sv, err)
	}
	a.st = &spb.Status{Code: int32(n), Message: decodeGRPCMessage(tr.Get("Grpc-Message"))}
	if d := tr.Get("Grpc-Status-Details-Bin"); d != "" {
		b, err := decodeBin(d)
		if err != nil {
			return nil, fmt.Errorf("grpc-status-details-bin: %w", err)
		}
		var full spb.Status
		if err := proto.Unmarshal(b, &full); err != nil {
			return nil, fmt.Errorf("grpc-status-details-bin: %w", err)
		}
		a.st.Details = full.Details
	}
	for k, vs := range tr {
		if !reservedRPCHeader(k) && a.header[k] == nil {
			a.trailer[k] = vs
		}
	}
	if a.st.Code != 0 {
		// A message and then an error (grpcio sends the handler's return
		// value so): a unary client gets the error only.
		a.msg, a.hasMsg = nil, false
	}
	return a, nil
}

var errManyMessages = errors.New("the answer is not a unary one (more than one message, or a message with an error)")

func parseConnectAnswer(a *rpcAnswer, status int, h http.Header, body []byte, limit int64) (*rpcAnswer, error) {
	for k, vs := range h {
		if name, ok := strings.CutPrefix(k, "Trailer-"); ok && name != "" {
			a.trailer[http.CanonicalHeaderKey(name)] = vs
		}
	}
	if ce := h.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		if !strings.EqualFold(ce, "gzip") {
			return nil, fmt.Errorf("the upstream's answer is compressed with %q, which idem cannot store", ce)
		}
		var err error
		if body, err = gunzip(body, limit); err != nil {
			return nil, err
		}
	}
	if status == http.StatusOK {
		a.msg, a.hasMsg, a.st = body, true, &spb.Status{}
		return a, nil
	}
	var e struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Details []struct {
			Type  string `json:"type"`
			Value string `json:"value"`
		} `json:"details"`
	}
	c := rpccore.CodeOf(status)
	if mt, _, _ := mime.ParseMediaType(h.Get("Content-Type")); mt == "application/json" && json.Unmarshal(body, &e) == nil && e.Code != "" {
		if n, ok := connectCodes[e.Code]; ok {
			c = n
		}
	} else {
		// An HTTP error instead of a Connect one (a balancer's 502): the
		// code Connect clients give it, and settled by its HTTP status,
		// as a gRPC call's is.
		c, a.httpStatus = grpcCodeOfHTTP(status), status
		e.Message = fmt.Sprintf("the upstream answered HTTP %d", status)
	}
	a.st = &spb.Status{Code: int32(c), Message: e.Message}
	for _, d := range e.Details {
		v, err := decodeBin(d.Value)
		if err != nil {
			return nil, fmt.Errorf("a Connect error detail: %w", err)
		}
		a.st.Details = append(a.st.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type, Value: v})
	}
	return a, nil
}

// parseWebTrailer reads a gRPC-Web trailer frame: HTTP/1-style header
// lines.
func parseWebTrailer(b []byte, into http.Header) error {
	for line := range strings.SplitSeq(string(b), "\r\n") {
		if line == "" {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			return errors.New("a gRPC-Web trailer line has no colon")
		}
		into.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	return nil
}

// decodeBin decodes a -bin value, padded or not.
func decodeBin(s string) ([]byte, error) {
	s = strings.TrimRight(s, "=")
	return base64.RawStdEncoding.DecodeString(s)
}

// grpcCodeOfHTTP is the code a gRPC client gives an HTTP status that
// came without grpc-status (gRPC's http-grpc-status-mapping).
func grpcCodeOfHTTP(status int) code.Code {
	switch status {
	case http.StatusBadRequest:
		return code.Code_INTERNAL
	case http.StatusUnauthorized:
		return code.Code_UNAUTHENTICATED
	case http.StatusForbidden:
		return code.Code_PERMISSION_DENIED
	case http.StatusNotFound:
		return code.Code_UNIMPLEMENTED
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return code.Code_UNAVAILABLE
	}
	return code.Code_UNKNOWN
}

// connectCodes are Connect's names of the codes.
var connectCodes = func() map[string]code.Code {
	m := map[string]code.Code{}
	for n, c := range code.Code_value {
		if c != 0 {
			name := strings.ToLower(n)
			if name == "cancelled" {
				name = "canceled" // Connect spells it so
			}
			m[name] = code.Code(c)
		}
	}
	return m
}()

func connectCodeName(c code.Code) string {
	if c == code.Code_CANCELLED {
		return "canceled"
	}
	return strings.ToLower(c.String())
}

// grpc-message is percent-encoded (gRPC's PROTOCOL-HTTP2).
func encodeGRPCMessage(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= ' ' && c <= '~' && c != '%' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

func decodeGRPCMessage(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	if d, err := url.PathUnescape(s); err == nil {
		return d
	}
	return s
}

// writeRPC writes a as the answer to a call of c, in c's protocol.
// replayed marks a replay (idempotent-replayed: true).
func writeRPC(w http.ResponseWriter, c rpcCall, a *rpcAnswer, replayed bool) {
	h := w.Header()
	for k, vs := range a.header {
		h[k] = vs
	}
	if replayed {
		h.Set(headerReplayed, "true")
	}
	switch c.kind {
	case rpcConnect:
		writeConnect(w, c, a)
		return
	case rpcWeb:
		h.Set("Content-Type", c.contentType)
		h.Del("Content-Length")
		w.WriteHeader(http.StatusOK)
		var body []byte
		if a.hasMsg {
			body = appendFrame(body, 0, a.msg)
		}
		var tb bytes.Buffer
		statusLines(a.st, func(k, v string) { fmt.Fprintf(&tb, "%s: %s\r\n", k, v) })
		for k, vs := range a.trailer {
			for _, v := range vs {
				fmt.Fprintf(&tb, "%s: %s\r\n", strings.ToLower(k), v)
			}
		}
		body = appendFrame(body, flagTrailer, tb.Bytes())
		_, _ = w.Write(body)
		return
	}
	h.Set("Content-Type", c.contentType)
	if !a.hasMsg {
		// Trailers-only: the status and trailers in the one header block.
		statusLines(a.st, h.Set)
		for k, vs := range a.trailer {
			h[k] = vs
		}
		w.WriteHeader(http.StatusOK)
		return
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(appendFrame(make([]byte, 0, prefixLen+len(a.msg)), 0, a.msg))
	statusLines(a.st, func(k, v string) { h.Set(http.TrailerPrefix+k, v) })
	for k, vs := range a.trailer {
		h[http.TrailerPrefix+k] = vs
	}
}

// headerReplayed marks a replayed answer, as the gRPC front doors do.
const headerReplayed = rpccore.HeaderReplayed

// statusLines calls set with the status's grpc-status, grpc-message and
// grpc-status-details-bin.
func statusLines(st *spb.Status, set func(k, v string)) {
	set("grpc-status", strconv.Itoa(int(st.GetCode())))
	if st.GetMessage() != "" {
		set("grpc-message", encodeGRPCMessage(st.GetMessage()))
	}
	if len(st.GetDetails()) > 0 {
		b, err := proto.Marshal(st)
		if err == nil {
			set("grpc-status-details-bin", base64.RawStdEncoding.EncodeToString(b))
		}
	}
}

func writeConnect(w http.ResponseWriter, c rpcCall, a *rpcAnswer) {
	h := w.Header()
	for k, vs := range a.trailer {
		h["Trailer-"+k] = vs
	}
	if a.st.GetCode() == 0 {
		h.Set("Content-Type", c.contentType)
		h.Set("Content-Length", strconv.Itoa(len(a.msg)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(a.msg)
		return
	}
	type detail struct {
		Type  string `json:"type"`
		Value string `json:"value"`
	}
	e := struct {
		Code    string   `json:"code"`
		Message string   `json:"message,omitempty"`
		Details []detail `json:"details,omitempty"`
	}{Code: connectCodeName(code.Code(a.st.GetCode())), Message: a.st.GetMessage()}
	for _, d := range a.st.GetDetails() {
		typeURL := d.GetTypeUrl()
		e.Details = append(e.Details, detail{Type: typeURL[strings.LastIndexByte(typeURL, '/')+1:], Value: base64.RawStdEncoding.EncodeToString(d.GetValue())})
	}
	b, _ := json.Marshal(e)
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(rpccore.HTTPStatus(code.Code(a.st.GetCode())))
	_, _ = w.Write(b)
}

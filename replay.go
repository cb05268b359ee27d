package idem

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/idem-dev/idem/internal/replaygate"
)

// Replays and content negotiation. A stored answer is one representation:
// the one the first request negotiated (Accept-Encoding, Accept,
// Accept-Language…). A retry that negotiates differently must still get
// an answer it can read, or be told why it cannot, never a silently
// different representation:
//
//   - a coded body (Content-Encoding gzip or deflate) is decoded for a
//     retry whose Accept-Encoding does not accept the coding (or that
//     sends none), up to Config.MaxDecodedReplay bytes; a coding idem
//     cannot decode (br, zstd), more than maxReplayCodings codings, a body
//     over the limit or one that does not decode get 406 not-acceptable, naming the Accept-Encoding to retry
//     with;
//   - for every other request header the answer's Vary names, the first
//     request's value is kept on the record as a digest (keyed like
//     fingerprints), and a retry that sends another value gets 406
//     not-acceptable, naming the header. Credentials (Authorization,
//     Proxy-Authorization, Cookie) are not compared: whose answer it is
//     is the scope's business, and a rotated token or cookie must not
//     lock a client out of its answer. Nor is Origin: it chooses CORS
//     headers, not the representation, and idem serve sets those on a
//     replay for the origin that asks (cors_origins). "Vary: *" names no header idem
//     could compare: the answer is replayed as stored.
//
// Records stored before idem kept these digests replay as stored.

// varyDigestHeader is the stored header that keeps the digests of the
// first request's values of the headers the answer varies on. It is never
// replayed.
const varyDigestHeader = "Idem-Request-Vary"

// DefaultMaxDecodedReplay is Config.MaxDecodedReplay's default.
const DefaultMaxDecodedReplay = 16 << 20

// varyCompared reports whether a retry's value of the header name (in
// canonical form), which a stored answer's Vary names, is compared with
// the first request's.
func varyCompared(name string) bool {
	switch name {
	case "Accept-Encoding", "Authorization", "Proxy-Authorization", "Cookie", "Origin", "*":
		return false
	}
	return validHeaderName(name)
}

// headerValues returns the values of the header canonical in h, also when
// it was set under another case.
func headerValues(h http.Header, canonical string) []string {
	if vs, ok := h[canonical]; ok {
		return vs
	}
	for name, vs := range h {
		if len(name) == len(canonical) && textproto.CanonicalMIMEHeaderKey(name) == canonical {
			return vs
		}
	}
	return nil
}

// listItems returns the comma-separated items of a header's values.
func listItems(vs []string) []string {
	var out []string
	for _, v := range vs {
		out = append(out, splitComma(v)...)
	}
	return out
}

// varyDigest is the digest of r's value of the header name: its items,
// trimmed, so that "en, fr" and "en,fr" are one value.
func (m *middleware) varyDigest(name string, r *http.Request) string {
	var h hash.Hash
	if len(m.cfg.FingerprintKey) > 0 {
		h = hmac.New(sha256.New, m.cfg.FingerprintKey)
	} else {
		h = sha256.New()
	}
	io.WriteString(h, "idem vary\x00"+name+"\x00"+strings.Join(listItems(r.Header.Values(name)), ","))
	return base64.RawStdEncoding.EncodeToString(h.Sum(nil)[:16])
}

// withVaryDigests returns resp with the digests of r's values of the
// headers its Vary names (those compared), for the replay to compare a
// retry's with; a digest header the handler set itself is dropped. The
// header map is copied when changed: it is also the answer the client is
// about to get.
func (m *middleware) withVaryDigests(resp *Response, r *http.Request) *Response {
	if resp.NotReplayable != "" || !hasVaryHeaders(resp.Header) {
		return resp
	}
	var (
		b    strings.Builder
		seen []string
	)
	for _, n := range listItems(headerValues(resp.Header, "Vary")) {
		n = textproto.CanonicalMIMEHeaderKey(n)
		if !varyCompared(n) || slices.Contains(seen, n) {
			continue
		}
		seen = append(seen, n)
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(n + "=" + m.varyDigest(n, r))
	}
	if b.Len() == 0 && headerValues(resp.Header, varyDigestHeader) == nil {
		return resp
	}
	h := make(http.Header, len(resp.Header)+1)
	for name, v := range resp.Header {
		if textproto.CanonicalMIMEHeaderKey(name) != varyDigestHeader {
			h[name] = v
		}
	}
	if b.Len() > 0 {
		h[varyDigestHeader] = []string{b.String()}
	}
	out := *resp
	out.Header = h
	return &out
}

// hasVaryHeaders reports whether h has a Vary or an Idem-Request-Vary
// header, under any spelling of its name: one pass over h, where looking
// each up with headerValues costs a look-up and a pass each when, as
// usually, neither is there.
func hasVaryHeaders(h http.Header) bool {
	for name := range h {
		if len(name) != len("Vary") && len(name) != len(varyDigestHeader) {
			continue
		}
		if n := textproto.CanonicalMIMEHeaderKey(name); n == "Vary" || n == varyDigestHeader {
			return true
		}
	}
	return false
}

// varyDiffers returns the headers whose value in r differs from the first
// request's, as the stored digests tell.
func (m *middleware) varyDiffers(stored http.Header, r *http.Request) []string {
	var differ []string
	for _, item := range listItems(headerValues(stored, varyDigestHeader)) {
		name, digest, ok := strings.Cut(item, "=")
		if !ok || !varyCompared(name) {
			continue
		}
		if !hmac.Equal([]byte(m.varyDigest(name, r)), []byte(digest)) {
			differ = append(differ, name)
		}
	}
	return differ
}

// storedCodings returns the content codings of a stored answer, in the
// order they were applied, without identity.
func storedCodings(h http.Header) []string {
	var out []string
	for _, c := range listItems(headerValues(h, "Content-Encoding")) {
		if c = strings.ToLower(c); c != "identity" {
			out = append(out, c)
		}
	}
	return out
}

// acceptsCodings reports whether the Accept-Encoding values accept every
// one of codings (RFC 9110 §12.5.3). A request without Accept-Encoding
// accepts none: the RFC lets a server send it any coding, but clients that
// send none (curl without --compressed, most HTTP libraries when asked for
// an uncompressed body) cannot read one.
func acceptsCodings(accept []string, codings []string) bool {
	if len(accept) == 0 {
		return false
	}
	items := listItems(accept)
	for _, c := range codings {
		q, star := -1.0, -1.0
		for _, it := range items {
			name, params, _ := strings.Cut(it, ";")
			name = strings.ToLower(strings.TrimSpace(name))
			iq := qValue(params)
			switch {
			case name == c || name == "x-"+c || "x-"+name == c:
				q = iq
			case name == "*":
				star = iq
			}
		}
		if q < 0 {
			q = star
		}
		if q <= 0 {
			return false
		}
	}
	return true
}

// qValue returns the q parameter of an Accept-Encoding item's parameters
// (1 when absent, 0 when malformed).
func qValue(params string) float64 {
	for p := range strings.SplitSeq(params, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if ok && strings.EqualFold(strings.TrimSpace(k), "q") {
			q, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil || q < 0 || q > 1 {
				return 0
			}
			return q
		}
	}
	return 1
}

var errUnknownCoding = errors.New("idem: a content coding idem cannot decode")

// decoder returns body decoded from codings, applied in order. It fails
// with errUnknownCoding for a coding other than gzip and deflate.
func decoder(body []byte, codings []string) (io.Reader, error) {
	var r io.Reader = newSliceReader(body)
	for i := len(codings) - 1; i >= 0; i-- {
		switch codings[i] {
		case "gzip", "x-gzip":
			zr, err := gzip.NewReader(r)
			if err != nil {
				return nil, err
			}
			r = zr
		case "deflate":
			// HTTP's deflate is zlib (RFC 9110 §8.4.1.2); some servers send
			// the raw format, which a zlib header tells apart.
			br := bufio.NewReader(r)
			if h, err := br.Peek(2); err == nil && h[0]&0x0f == 8 && (uint16(h[0])<<8|uint16(h[1]))%31 == 0 {
				zr, err := zlib.NewReader(br)
				if err != nil {
					return nil, err
				}
				r = zr
			} else {
				r = flate.NewReader(br)
			}
		default:
			return nil, fmt.Errorf("%w: %s", errUnknownCoding, codings[i])
		}
	}
	return r, nil
}

type sliceReader struct{ b []byte }

func newSliceReader(b []byte) *sliceReader { return &sliceReader{b} }

func (s *sliceReader) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.b)
	s.b = s.b[n:]
	return n, nil
}

// decodedSize decodes body to count its bytes, up to limit: over reports
// more.
func decodedSize(body []byte, codings []string, limit int64) (n int64, over bool, err error) {
	r, err := decoder(body, codings)
	if err != nil {
		return 0, false, err
	}
	buf := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(buf)
	n, err = io.CopyBuffer(discard{}, io.LimitReader(r, limit+1), *buf)
	if err != nil {
		return n, false, err
	}
	return n, n > limit, nil
}

// discard is io.Discard without its ReaderFrom, so that CopyBuffer uses
// the pooled buffer.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// decodeCost is what decoding a replay holds beyond its stored body: the
// decompressor's window and state, and a copy buffer.
const decodeCost = 128 << 10

// maxReplayCodings is the most content codings idem decodes for one
// replay: each holds a decompressor of its own (about 45 KiB) while the
// replay is written, so an answer coded gzip upon gzip thousands of times,
// as a stored body of 1 MiB can be, would hold gigabytes. HTTP answers
// carry one coding, seldom two.
const maxReplayCodings = 2

// replay writes a stored answer and returns the outcome and status. held
// is what the engine already took of the request's replay gate to read the
// answer (Result.held), which covers its body.
func (m *middleware) replay(w http.ResponseWriter, r *http.Request, resp *Response, key string, held int64) (string, int) {
	if resp.NotReplayable != "" {
		w.Header().Set("Idempotency-Original-Status", strconv.Itoa(resp.Status))
		return m.problem(w, SituationNotReplayable.ProblemDoc(fmt.Sprintf("The request with this Idempotency-Key completed with status %d, but its answer was not kept (%s), so it cannot be replayed. It will not run again.", resp.Status, resp.NotReplayable), key))
	}
	if differ := m.varyDiffers(resp.Header, r); len(differ) > 0 {
		names := strings.Join(differ, ", ")
		return m.problem(w, SituationNotAcceptable.ProblemDoc(fmt.Sprintf("The answer to the request with this Idempotency-Key was chosen by its %s (the answer's Vary names it), and this retry sends another value. The request will not run again; retry with the %s the first request sent to get its answer.", names, names), key))
	}
	codings := storedCodings(resp.Header)
	// An empty body (a 204) has nothing to decode.
	decode := len(codings) > 0 && len(resp.Body) > 0 && !acceptsCodings(r.Header["Accept-Encoding"], codings)
	cost := int64(len(resp.Body))
	if decode && len(codings) <= maxReplayCodings {
		cost += decodeCost * int64(len(codings))
	}
	// A request holds at most the whole gate: an answer larger than it is
	// replayed alone, on what the engine took to read it.
	if gate := replaygate.From(r.Context()); gate != nil {
		took, ok := replaygate.Raise(gate, held, cost)
		if !ok {
			return m.replayBusy(w, key)
		}
		defer gate.Release(took)
	}
	size := int64(len(resp.Body))
	if decode {
		coded := strings.Join(codings, ", ")
		if len(codings) > maxReplayCodings {
			return m.problem(w, SituationNotAcceptable.ProblemDoc(fmt.Sprintf("The answer to the request with this Idempotency-Key is stored with %d content codings, which this retry does not accept and idem decodes no more than %d of. The request will not run again; retry with Accept-Encoding: %s to get its answer.", len(codings), maxReplayCodings, coded), key))
		}
		n, over, err := decodedSize(resp.Body, codings, m.maxDecoded)
		switch {
		case errors.Is(err, errUnknownCoding):
			return m.problem(w, SituationNotAcceptable.ProblemDoc(fmt.Sprintf("The answer to the request with this Idempotency-Key is stored with Content-Encoding %s, which this retry does not accept and idem does not decode. The request will not run again; retry with Accept-Encoding: %s to get its answer.", coded, coded), key))
		case err != nil:
			m.cfg.Logger.LogAttrs(r.Context(), slog.LevelWarn, "idem: a stored answer does not decode from its Content-Encoding",
				slog.String("content_encoding", coded), slog.Any("error", err))
			return m.problem(w, SituationNotAcceptable.ProblemDoc(fmt.Sprintf("The answer to the request with this Idempotency-Key is stored with Content-Encoding %s, which this retry does not accept, and it does not decode. The request will not run again; retry with Accept-Encoding: %s to get it as it was stored.", coded, coded), key))
		case over:
			return m.problem(w, SituationNotAcceptable.ProblemDoc(fmt.Sprintf("The answer to the request with this Idempotency-Key is stored with Content-Encoding %s, which this retry does not accept, and it decodes to more than the %d bytes idem decodes for a client. The request will not run again; retry with Accept-Encoding: %s to get its answer.", coded, m.maxDecoded, coded), key))
		}
		size = n
	}
	h := w.Header()
	for name, values := range resp.Header {
		cn := textproto.CanonicalMIMEHeaderKey(name)
		if cn == varyDigestHeader {
			continue
		}
		if decode {
			switch cn {
			case "Content-Encoding", "Content-Md5", "Content-Digest", "Repr-Digest":
				continue
			case "Etag":
				// A strong validator names the coded bytes; the decoded
				// body is the same resource, but not those bytes.
				if len(values) > 0 && !strings.HasPrefix(values[0], "W/") {
					values = []string{"W/" + values[0]}
				}
			}
		}
		h[name] = values
	}
	h["Idempotent-Replayed"] = valTrue
	h[outcomeHeader] = valReplayed
	h.Set("Content-Length", strconv.FormatInt(size, 10))
	w.WriteHeader(resp.Status)
	if !decode {
		_, _ = w.Write(resp.Body)
		return SituationReplayed.Name, resp.Status
	}
	dr, err := decoder(resp.Body, codings)
	if err == nil {
		buf := copyBuffers.Get().(*[]byte)
		_, _ = io.CopyBuffer(writerOnly{w}, io.LimitReader(dr, size), *buf)
		copyBuffers.Put(buf)
	}
	return SituationReplayed.Name, resp.Status
}

// writerOnly hides a writer's ReadFrom, so that CopyBuffer uses its buffer.
type writerOnly struct{ io.Writer }

// replayGate is the replay gate r's context carries, for the engine to
// read large answers within it; none in observe mode, which replays
// nothing.
func replayGate(r *http.Request, pol *Policy) replaygate.Gate {
	if pol.Observe {
		return nil
	}
	return replaygate.From(r.Context())
}

// replayBusy answers 503 busy to a replay its gate had no room for.
func (m *middleware) replayBusy(w http.ResponseWriter, key string) (string, int) {
	w.Header().Set("Retry-After", "1")
	return m.problem(w, SituationBusy.ProblemDoc("The server holds as many replays as it may while clients read them; this one was not written. Retry with the same key.", key))
}

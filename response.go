package idem

import (
	"net/http"
	"net/textproto"
	"strings"

	"github.com/idem-dev/idem/idemstore"
)

// Response is a stored answer: status, headers and body.
type Response = idemstore.Response

// Reasons recorded in Response.NotReplayable.
const (
	// NotReplayableTooLarge: the body was over EngineConfig.MaxResponseBody.
	NotReplayableTooLarge = "body_too_large"
	// NotReplayableStreamed: the handler streamed (flushed) its answer.
	NotReplayableStreamed = "streamed"
	// NotReplayableHijacked: the handler took over the connection.
	NotReplayableHijacked = "hijacked"
)

// unstoredNames are the headers never kept in a stored response: cookies
// belong to the first answer only, hop-by-hop headers to one connection,
// Date to one moment, and Content-Length to the body as it is written.
// Credentials are never stored either.
var unstoredNames = [...]string{"Set-Cookie", "Date", "Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding",
	"Upgrade", "Authorization", "Cookie", "Content-Length"}

// unstoredLengths has bit n set when a name in unstoredNames is n bytes
// long (all are shorter than 64): a name of another length is stored
// without being canonicalised or compared.
var unstoredLengths = func() (m uint64) {
	for _, n := range unstoredNames {
		m |= 1 << len(n)
	}
	return m
}()

// mayBeUnstored reports whether a header name n bytes long, in any case,
// may be one of unstoredNames (canonicalising keeps a name's length).
func mayBeUnstored(n int) bool { return n < 64 && unstoredLengths&(1<<n) != 0 }

// unstored reports whether name, in canonical form, is one of
// unstoredNames.
func unstored(name string) bool {
	if !mayBeUnstored(len(name)) {
		return false
	}
	for _, n := range unstoredNames {
		if n == name {
			return true
		}
	}
	return false
}

// canonicalField is the canonical name of the field a header map's name
// is sent as: a trailer set under http.TrailerPrefix is sent without it.
func canonicalField(name string) string {
	return textproto.CanonicalMIMEHeaderKey(strings.TrimPrefix(name, http.TrailerPrefix))
}

// storableHeader returns h without the headers that must not be stored
// (Set-Cookie, hop-by-hop headers, Date, credentials, and headers named in
// Connection). Names are compared in canonical form, so a handler that set
// w.Header()["set-cookie"] directly is filtered too, and a trailer set
// under http.TrailerPrefix ("Trailer:Set-Cookie") as the field it sends.
// It returns h itself when nothing needs removing.
func storableHeader(h http.Header) http.Header {
	if len(h) == 0 {
		return nil
	}
	drop := false
	for name := range h {
		name = strings.TrimPrefix(name, http.TrailerPrefix) // the field a trailer is sent as
		if mayBeUnstored(len(name)) && unstored(textproto.CanonicalMIMEHeaderKey(name)) {
			drop = true
			break
		}
	}
	if !drop {
		return h
	}
	out := make(http.Header, len(h))
	var named []string // header names listed in Connection
	for name, v := range h {
		cn := canonicalField(name)
		if cn == "Connection" {
			for _, c := range v {
				named = append(named, splitComma(c)...)
			}
		}
		if !unstored(cn) {
			out[name] = v
		}
	}
	for _, n := range named {
		cn := textproto.CanonicalMIMEHeaderKey(n)
		for name := range out {
			if canonicalField(name) == cn {
				delete(out, name)
			}
		}
	}
	return out
}

// headerValue returns the first value of the header canonical names, also
// when a handler set it under another case (w.Header()["content-type"]).
func headerValue(h http.Header, canonical string) string {
	if vs, ok := h[canonical]; ok {
		return firstValue(vs)
	}
	for name, vs := range h {
		if len(name) == len(canonical) && textproto.CanonicalMIMEHeaderKey(name) == canonical {
			return firstValue(vs)
		}
	}
	return ""
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			f := s[start:i]
			for len(f) > 0 && (f[0] == ' ' || f[0] == '\t') {
				f = f[1:]
			}
			for len(f) > 0 && (f[len(f)-1] == ' ' || f[len(f)-1] == '\t') {
				f = f[:len(f)-1]
			}
			if f != "" {
				out = append(out, f)
			}
			start = i + 1
		}
	}
	return out
}

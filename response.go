package idem

import (
	"net/http"

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

// unstored reports the headers never kept in a stored response: cookies
// belong to the first answer only, hop-by-hop headers to one connection,
// Date to one moment, and Content-Length to the body as it is written.
// Credentials are never stored either. (A switch: cheaper than a map on
// every stored answer.)
func unstored(name string) bool {
	switch name {
	case "Set-Cookie", "Date", "Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding",
		"Upgrade", "Authorization", "Cookie", "Content-Length":
		return true
	}
	return false
}

// storableHeader returns h without the headers that must not be stored
// (Set-Cookie, hop-by-hop headers, Date, credentials, and headers named in
// Connection). It returns h itself when nothing needs removing.
func storableHeader(h http.Header) http.Header {
	if len(h) == 0 {
		return nil
	}
	drop := false
	for name := range h {
		if unstored(name) {
			drop = true
			break
		}
	}
	if !drop {
		return h
	}
	out := make(http.Header, len(h))
	for name, v := range h {
		if !unstored(name) {
			out[name] = v
		}
	}
	for _, c := range h.Values("Connection") {
		for _, name := range splitComma(c) {
			delete(out, http.CanonicalHeaderKey(name))
		}
	}
	return out
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

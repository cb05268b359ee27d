package idemadmin

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"sort"

	"github.com/idem-dev/idem/idemstore"
)

// MaxAnswerBody is the largest body an operator or a resolver may store
// as a key's answer.
const MaxAnswerBody = 1 << 20

// Answer is the response an operator (or a resolver) says the operation
// gave: what every retry gets once a key is completed with it.
type Answer struct {
	// Status is the HTTP status, 200 to 599.
	Status int `json:"status"`
	// Headers are the answer's headers; each value is a string or a list
	// of strings.
	Headers map[string]HeaderValues `json:"headers,omitempty"`
	// Body is the answer's body as text; BodyBase64 is the alternative for
	// bytes that are not UTF-8. At most one of them.
	Body       *string `json:"body,omitempty"`
	BodyBase64 *string `json:"body_base64,omitempty"`
}

// HeaderValues is one header's values: in JSON, a string or a list of
// strings.
type HeaderValues []string

// UnmarshalJSON reads a string or a list of strings.
func (v *HeaderValues) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*v = HeaderValues{one}
		return nil
	}
	var list []string
	if err := json.Unmarshal(b, &list); err != nil {
		return errors.New("a header value must be a string or a list of strings")
	}
	*v = list
	return nil
}

// neverStored are the headers an answer may not carry: a stored answer is
// replayed to many requests, and these belong to one (cookies, one
// connection's hop-by-hop headers, credentials, the moment's Date, the
// length the replay sets itself).
var neverStored = map[string]bool{
	"Set-Cookie": true, "Date": true, "Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true,
	"Upgrade": true, "Authorization": true, "Cookie": true, "Content-Length": true,
}

// Response checks a and returns the stored response it describes. With
// dropUnstorable, headers that are never stored (Set-Cookie, hop-by-hop,
// Date, Content-Length, credentials) are left out; without, they are an
// error that names them.
func (a Answer) Response(dropUnstorable bool) (*idemstore.Response, error) {
	if a.Status < 200 || a.Status > 599 {
		return nil, fmt.Errorf("status %d is not a final HTTP status (200-599)", a.Status)
	}
	resp := &idemstore.Response{Status: a.Status, Header: http.Header{}}
	switch {
	case a.Body != nil && a.BodyBase64 != nil:
		return nil, errors.New("give body or body_base64, not both")
	case a.Body != nil:
		resp.Body = []byte(*a.Body)
	case a.BodyBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*a.BodyBase64)
		if err != nil {
			return nil, fmt.Errorf("body_base64: %v", err)
		}
		resp.Body = b
	}
	if len(resp.Body) > MaxAnswerBody {
		return nil, fmt.Errorf("the body has %d bytes; at most %d can be stored", len(resp.Body), MaxAnswerBody)
	}
	names := make([]string, 0, len(a.Headers))
	for name := range a.Headers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !validHeaderName(name) {
			return nil, fmt.Errorf("header name %q is not a valid HTTP header name", name)
		}
		cn := textproto.CanonicalMIMEHeaderKey(name)
		if neverStored[cn] {
			if dropUnstorable {
				continue
			}
			return nil, fmt.Errorf("header %s is never stored in an answer (it belongs to one response or one connection)", cn)
		}
		for _, v := range a.Headers[name] {
			if !validHeaderValue(v) {
				return nil, fmt.Errorf("header %s: value %q holds a control character", cn, v)
			}
			resp.Header[cn] = append(resp.Header[cn], v)
		}
	}
	if len(resp.Header) == 0 {
		resp.Header = nil
	}
	return resp, nil
}

// validHeaderName reports an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') && !isTokenPunct(c) {
			return false
		}
	}
	return true
}

func isTokenPunct(c byte) bool {
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// validHeaderValue refuses control characters other than tab (CR and LF
// would split the header when the answer is replayed).
func validHeaderValue(s string) bool {
	if len(s) > 8192 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

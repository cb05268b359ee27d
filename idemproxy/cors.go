package idemproxy

import (
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strings"

	"github.com/idem-dev/idem"
)

// corsExposed are the headers idem adds that a browser client needs to
// read.
var corsExposed = []string{"Idempotent-Replayed", "Idempotency-Outcome", "Retry-After"}

// checkOrigins reports a cors_origins entry that is not "*" nor an origin
// (scheme://host[:port], no path).
func checkOrigins(origins []string) error {
	for _, o := range origins {
		if o == "*" {
			continue
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return fmt.Errorf("cors origin %q must be an origin such as https://app.example.com, or *", o)
		}
	}
	return nil
}

// checkProblemBase reports a problem_base_url that is not absolute.
func checkProblemBase(base string) error {
	if base == "" {
		return nil
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("problem_base_url " + fmt.Sprintf("%q", base) + " must be an absolute http:// or https:// URL, such as https://api.example.com/problems#")
	}
	return nil
}

// corsFor returns the origin to allow for r, or "" when r has no Origin or
// one not in origins.
func corsFor(origins []string, r *http.Request) string {
	o := r.Header.Get("Origin")
	if o == "" || len(origins) == 0 {
		return ""
	}
	for _, allowed := range origins {
		if allowed == "*" || strings.EqualFold(strings.TrimSuffix(allowed, "/"), o) {
			return o
		}
	}
	return ""
}

// corsWriter adds CORS headers to the answer of a request from an allowed
// origin, as its status goes out. idem's own answers (problem documents,
// replays) get Access-Control-Allow-Origin and expose the headers idem
// adds; the upstream's own answers keep its CORS policy, and, when it
// allowed the origin, expose idem's headers too. A preflight, answered by
// the upstream, always lists idem's exposed headers, and allows the
// Idempotency-Key request header when the upstream lists allowed ones.
type corsWriter struct {
	http.ResponseWriter
	origin    string
	preflight bool
	done      bool
}

func (c *corsWriter) WriteHeader(code int) {
	if !c.done && (code >= 200 || code == http.StatusSwitchingProtocols) {
		c.done = true
		c.apply()
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *corsWriter) Write(b []byte) (int, error) {
	if !c.done {
		c.WriteHeader(http.StatusOK)
	}
	return c.ResponseWriter.Write(b)
}

func (c *corsWriter) apply() {
	h := c.ResponseWriter.Header()
	outcome := h.Get("Idempotency-Outcome")
	own := outcome != "" && outcome != idem.SituationAcquired.Name
	if !own && !c.preflight && h.Get("Access-Control-Allow-Origin") == "" {
		return // the upstream's answer, and it did not allow this origin
	}
	if own {
		h.Set("Access-Control-Allow-Origin", c.origin)
		if !slices.ContainsFunc(h.Values("Vary"), func(v string) bool { return headerListHas(v, "Origin") }) {
			h.Add("Vary", "Origin")
		}
	}
	mergeList(h, "Access-Control-Expose-Headers", corsExposed...)
	if c.preflight && h.Get("Access-Control-Allow-Headers") != "" {
		mergeList(h, "Access-Control-Allow-Headers", idem.HeaderName)
	}
}

// mergeList adds the names missing from the comma-separated header list.
func mergeList(h http.Header, list string, names ...string) {
	have := strings.Join(h.Values(list), ",")
	if strings.TrimSpace(have) == "*" {
		return
	}
	var add []string
	for _, n := range names {
		if !headerListHas(have, n) {
			add = append(add, n)
		}
	}
	if len(add) == 0 {
		return
	}
	if strings.TrimSpace(have) != "" {
		add = append([]string{have}, add...)
	}
	h.Set(list, strings.Join(add, ", "))
}

// headerListHas reports whether the comma-separated list names name.
func headerListHas(list, name string) bool {
	for v := range strings.SplitSeq(list, ",") {
		if textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(v)) == textproto.CanonicalMIMEHeaderKey(name) {
			return true
		}
	}
	return false
}

// Flush passes a flush on.
func (c *corsWriter) Flush() {
	if !c.done {
		c.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(c.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the writer underneath
// (Hijack, deadlines).
func (c *corsWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

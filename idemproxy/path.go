package idemproxy

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/idem-dev/idem/internal/urlpath"
)

// The path rule. A request's operation is its method and its path, and
// the path is what the upstream acts on; spellings that the upstream reads
// as one path must be one operation, or one key runs once per spelling.
// Every request's path is therefore normalised, as RFC 3986 §6.2.2 says,
// before it is routed, keyed and forwarded, and the upstream gets the
// normalised path, so that idem and the upstream agree on the resource:
//
//   - percent-encoded unreserved characters (letters, digits, "-._~") are
//     decoded ("/%70ay" is "/pay"), and the hex digits of the other
//     escapes upper-cased ("%2f" is "%2F");
//   - runs of '/' become one (merge_slashes, on by default);
//   - dot segments are removed ("/./pay", "/x/../pay" and "/%2E/pay" are
//     "/pay");
//   - %2F stays encoded and apart from '/' (escaped_slashes: keep), or is
//     decoded first (decode), or refused on protected requests (reject);
//   - a ';' parameter is refused on protected requests (path_params:
//     reject), stripped from its segment (strip), or kept (keep).
//
// A request-target that is not a path ("POST *") is refused with 400,
// except CONNECT's.

// pathOptions are Config's path settings, fixed per configuration.
type pathOptions struct {
	mergeSlashes bool
	slashes      EscapedSlashes
	params       PathParams
}

func (c Config) pathOptions() pathOptions {
	return pathOptions{mergeSlashes: c.MergeSlashes == nil || *c.MergeSlashes, slashes: c.EscapedSlashes, params: c.PathParams}
}

// normalizePath returns the escaped path p normalised by o's rule.
func normalizePath(p string, o pathOptions) string {
	return urlpath.Normalize(p, urlpath.Options{MergeSlashes: o.mergeSlashes, DecodeSlashes: o.slashes == EscapedSlashesDecode, StripParams: o.params == PathParamsStrip})
}

// withPath returns r with its URL's path set to the escaped path p (r
// itself when p is its path already).
func withPath(r *http.Request, p string) *http.Request {
	if p == r.URL.EscapedPath() {
		return r
	}
	u := *r.URL
	path, err := url.PathUnescape(p)
	if err != nil { // p came from a valid escaped path; kept for safety
		return r
	}
	u.Path, u.RawPath = path, ""
	if u.EscapedPath() != p {
		u.RawPath = p
	}
	r2 := new(http.Request)
	*r2 = *r
	r2.URL = &u
	return r2
}

// pathRefusal says why o refuses a protected request's normalised path p,
// or "" when it does not.
func (o pathOptions) pathRefusal(p string) string {
	if o.params == PathParamsReject && strings.IndexByte(p, ';') >= 0 {
		return "The path carries a ';' parameter, which some servers drop before they route and others keep, so idem cannot tell which resource it names (path_params: reject). Send the path without it."
	}
	if o.slashes == EscapedSlashesReject && strings.Contains(p, "%2F") {
		return "The path carries an encoded slash (%2F), which some servers decode before they route and others keep (escaped_slashes: reject). Send the path without it."
	}
	return ""
}

// otherReading returns the normalised path p as read by the upstreams
// that o's reject policies guard against: its ';' parameters stripped
// (path_params: reject) and its %2F decoded (escaped_slashes: reject);
// "" when p carries neither.
func (o pathOptions) otherReading(p string) string {
	strip := o.params == PathParamsReject && strings.IndexByte(p, ';') >= 0
	decode := o.slashes == EscapedSlashesReject && strings.Contains(p, "%2F")
	if !strip && !decode {
		return ""
	}
	return urlpath.Normalize(p, urlpath.Options{MergeSlashes: o.mergeSlashes, DecodeSlashes: decode, StripParams: strip})
}

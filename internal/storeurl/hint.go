package storeurl

import (
	"fmt"
	"strings"
)

// noScheme explains a store URL without "://": a known scheme followed by a
// single colon ("sqlite:/tmp/x.db") gets the URL it most likely meant.
func noScheme(rawURL string) error {
	scheme, rest, ok := strings.Cut(rawURL, ":")
	if ok {
		switch s := strings.ToLower(scheme); s {
		case "sqlite", "sqlite3":
			path := strings.TrimLeft(rest, "/")
			if strings.HasPrefix(rest, "/") {
				return fmt.Errorf("store URL %q needs // after %s: (write %s:///%s for the absolute path /%s; %s://%s is relative to the working directory)", rawURL, scheme, s, path, path, s, path)
			}
			return fmt.Errorf("store URL %q needs // after %s: (write %s://%s for a path relative to the working directory, %s:///abs/path for an absolute one)", rawURL, scheme, s, rest, s)
		case "memory", "mem", "postgres", "postgresql", "mysql", "redis", "rediss", "redis+cluster", "rediss+cluster":
			return fmt.Errorf("store URL %q needs // after %s: (%s://%s)", Redact(rawURL), scheme, s, Redact(strings.TrimLeft(rest, "/")))
		}
	}
	return fmt.Errorf("store URL %q has no scheme; use sqlite://PATH, memory://, postgres://…, mysql://…, redis://… or redis+cluster://…", Redact(rawURL))
}

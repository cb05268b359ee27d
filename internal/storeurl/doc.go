// Package storeurl turns a store URL, as given to the idem command line,
// into an idemstore.Store. Start with Open; Parse checks a URL without
// connecting, and Redact makes one safe to log.
//
//	sqlite://idem.db               relative path (sqlite:///var/lib/idem.db: absolute)
//	memory://                      in-process, lost on exit
//	postgres://user:pass@host:5432/db?sslmode=disable   (or postgresql://;
//	                               &schema=NAME keeps idem's table in NAME, default public)
//	mysql://user:pass@tcp(host:3306)/db
//	redis://:pass@host:6379/0      (rediss:// for TLS; ?prefix=NAME starts idem's
//	                               keys, default idem; ?maxmemory_policy=noeviction
//	                               states the policy where CONFIG GET is refused)
//	redis+cluster://h1:7000,h2:7001   (?prefix=NAME and ?maxmemory_policy= too)
//
// Drivers take handles, never URLs; this package is the one place that
// parses connection strings.
package storeurl

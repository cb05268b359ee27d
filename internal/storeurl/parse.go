package storeurl

import (
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemredis"
	"github.com/idem-dev/idem/idemsqlite"
)

// Kind is the family of store a URL names.
type Kind string

// The kinds of store.
const (
	KindSQLite       Kind = "sqlite"
	KindMemory       Kind = "memory"
	KindPostgres     Kind = "postgres"
	KindMySQL        Kind = "mysql"
	KindRedis        Kind = "redis"
	KindRedisCluster Kind = "redis-cluster"
)

// Target is a parsed store URL, ready to connect.
type Target struct {
	Kind Kind
	// Redacted is the URL with its password hidden, for logs.
	Redacted string

	mem        idemmem.Config
	sqlitePath string
	sqliteOpts idemsqlite.OpenOptions
	batchOff   bool // batch=off: the SQL stores do not group commits
	pg         *pgxpool.Config
	pgSchema   string
	my         *mysql.Config
	redis      *redis.Options
	cluster    *redis.ClusterOptions
	redisPfx   string
	// redisPolicy is maxmemory_policy=, the policy of Redis servers that
	// do not tell it (see idemredis.Config.MaxmemoryPolicy).
	redisPolicy string
	// logger receives the store's own warnings (idemredis's policy
	// check); nil for slog.Default().
	logger *slog.Logger
}

// Parse checks rawURL and returns what it names, without connecting.
func Parse(rawURL string) (*Target, error) {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return nil, noScheme(rawURL)
	}
	t := &Target{Redacted: Redact(rawURL)}
	var err error
	switch strings.ToLower(scheme) {
	case "sqlite", "sqlite3":
		t.Kind = KindSQLite
		err = t.parseSQLite(rest)
	case "memory", "mem":
		t.Kind = KindMemory
		err = t.parseMemory(rest)
	case "postgres", "postgresql":
		t.Kind = KindPostgres
		err = t.parsePostgres(rawURL)
	case "mysql":
		t.Kind = KindMySQL
		t.my, err = parseMySQL(rest)
		if err == nil {
			t.batchOff, err = popMySQLBatch(t.my)
		}
	case "redis", "rediss", "unix":
		t.Kind = KindRedis
		err = t.parseRedis(rawURL)
	case "redis+cluster", "rediss+cluster":
		t.Kind = KindRedisCluster
		t.cluster, t.redisPfx, t.redisPolicy, err = parseCluster(scheme, rest)
		if err == nil {
			err = t.checkRedis()
		}
	default:
		return nil, fmt.Errorf("store URL %s: unknown scheme %q; use sqlite, memory, postgres, mysql, redis or redis+cluster", t.Redacted, scheme)
	}
	if err != nil {
		return nil, fmt.Errorf("store URL %s: %s", t.Redacted, redactErr(err, rawURL))
	}
	return t, nil
}

// parseSQLite reads PATH[?busy_timeout=DUR&synchronous=normal|full&max_open_conns=N].
// synchronous defaults to full here, unlike idemsqlite's own default.
func (t *Target) parseSQLite(rest string) error {
	path, query, _ := strings.Cut(rest, "?")
	if path == "" {
		return fmt.Errorf("sqlite:// needs a file path, as in sqlite://idem.db or sqlite:///var/lib/idem/idem.db")
	}
	t.sqlitePath = path
	q, err := url.ParseQuery(query)
	if err != nil {
		return err
	}
	for name, vs := range q {
		v := vs[len(vs)-1]
		switch name {
		case "busy_timeout":
			d, err := time.ParseDuration(v)
			if err != nil {
				return fmt.Errorf("busy_timeout: %v", err)
			}
			t.sqliteOpts.BusyTimeout = d
		case "synchronous":
			t.sqliteOpts.Synchronous = idemsqlite.Synchronous(strings.ToUpper(v))
			if t.sqliteOpts.Synchronous != idemsqlite.SynchronousNormal && t.sqliteOpts.Synchronous != idemsqlite.SynchronousFull {
				return fmt.Errorf("synchronous must be normal or full, got %q", v)
			}
		case "max_open_conns":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return fmt.Errorf("max_open_conns must be a positive integer, got %q", v)
			}
			t.sqliteOpts.MaxOpenConns = n
		case "batch":
			if t.batchOff, err = parseBatch(v); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unknown sqlite parameter %q (known: busy_timeout, synchronous, max_open_conns, batch)", name)
		}
	}
	if t.sqliteOpts.Synchronous == "" {
		// An acknowledged reservation must survive a power loss: with
		// NORMAL, the last commits before it can roll back, and a retry
		// of a request that ran would run again.
		t.sqliteOpts.Synchronous = idemsqlite.SynchronousFull
	}
	return nil
}

// parsePostgres reads a pgx connection URL. Its one parameter of idem's
// own, schema, names the PostgreSQL schema that holds idem's table (default
// public); it is taken out before pgx sees the URL, since pgx would send it
// to the server as a setting.
func (t *Target) parsePostgres(rawURL string) error {
	rawURL, schema, err := takeParam(rawURL, "schema", "public")
	if err != nil {
		return err
	}
	t.pgSchema = schema
	if rawURL, t.batchOff, err = takeBatch(rawURL); err != nil {
		return err
	}
	t.pg, err = pgxpool.ParseConfig(rawURL)
	return err
}

// parseRedis reads a go-redis URL. Its parameters of idem's own are taken
// out before go-redis, which refuses parameters it does not know: prefix
// starts every Redis key the store uses (default idem), and
// maxmemory_policy states the server's maxmemory-policy where CONFIG GET
// is refused (see idemredis.Config.MaxmemoryPolicy).
func (t *Target) parseRedis(rawURL string) error {
	rawURL, prefix, err := takeParam(rawURL, "prefix", "idem")
	if err != nil {
		return err
	}
	t.redisPfx = prefix
	if rawURL, t.redisPolicy, err = takeParam(rawURL, "maxmemory_policy", policyDefault); err != nil {
		return err
	}
	if t.redis, err = redis.ParseURL(rawURL); err != nil {
		return err
	}
	return t.checkRedis()
}

// policyDefault names what an absent maxmemory_policy means.
const policyDefault = "read from each server with CONFIG GET"

// checkRedis checks idem's own Redis parameters as idemredis.New would.
func (t *Target) checkRedis() error {
	return idemredis.Config{Prefix: t.redisPfx, MaxmemoryPolicy: t.redisPolicy}.Validate()
}

// takeParam removes the query parameter name from rawURL and returns the
// URL without it and its value ("" when absent). An empty value is an
// error that names the default.
func takeParam(rawURL, name, dflt string) (string, string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", "", err
	}
	q := u.Query()
	v, err := popParam(q, name, dflt)
	if err != nil || v == "" {
		return rawURL, "", err
	}
	u.RawQuery = q.Encode()
	return u.String(), v, nil
}

// popParam removes the parameter name from q and returns its value ("" when
// absent). An empty value is an error that names the default.
func popParam(q url.Values, name, dflt string) (string, error) {
	vs, ok := q[name]
	if !ok {
		return "", nil
	}
	v := vs[len(vs)-1]
	if v == "" {
		return "", fmt.Errorf("%s must not be empty; leave it out for the default, %s", name, dflt)
	}
	q.Del(name)
	return v, nil
}

// parseMySQL reads a go-sql-driver DSN after the mysql:// scheme.
func parseMySQL(dsn string) (*mysql.Config, error) {
	if dsn == "" {
		return nil, fmt.Errorf("mysql:// needs a DSN, as in mysql://user:pass@tcp(127.0.0.1:3306)/idem")
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	if cfg.DBName == "" {
		return nil, fmt.Errorf("mysql:// needs a database name after the address, as in tcp(host:3306)/idem")
	}
	// The store keeps times as Unix milliseconds; parseTime keeps any other
	// DATETIME a caller reads through this handle a time.Time in UTC.
	cfg.ParseTime = true
	if cfg.Loc == nil {
		cfg.Loc = time.UTC
	}
	// interpolateParams defaults to on: a statement with arguments then
	// takes one round trip instead of prepare, execute and close, which is
	// most of a batch's time. It escapes on the client, which is unsafe
	// under a multi-byte charset whose bytes can hide a backslash (GBK,
	// SJIS, Big5…): the default stays off when the DSN names a charset
	// other than the UTF-8 and single-byte ones, sets a character_set_*
	// variable, or asks for a collation the driver refuses with it. A DSN
	// that sets interpolateParams itself is taken as written.
	params := dsnParams(dsn)
	if _, set := params["interpolateParams"]; !set && safeToInterpolate(params) {
		on := cfg.Clone()
		on.InterpolateParams = true
		if _, err := mysql.ParseDSN(on.FormatDSN()); err == nil {
			cfg = on
		}
	}
	return cfg, nil
}

// dsnParams returns the parameters of a go-sql-driver DSN, read where the
// driver reads them: after the last '/', past a '?'.
func dsnParams(dsn string) map[string]string {
	params := map[string]string{}
	slash := strings.LastIndexByte(dsn, '/')
	if slash < 0 {
		return params
	}
	_, query, ok := strings.Cut(dsn[slash:], "?")
	if !ok {
		return params
	}
	for param := range strings.SplitSeq(query, "&") {
		k, v, _ := strings.Cut(param, "=")
		params[k] = v
	}
	return params
}

// safeToInterpolate reports whether a DSN's parameters leave the
// connection in a charset where escaping on the client is sound.
func safeToInterpolate(params map[string]string) bool {
	for k := range params {
		if strings.HasPrefix(strings.ToLower(k), "character_set_") {
			return false
		}
	}
	if charsets, ok := params["charset"]; ok {
		for cs := range strings.SplitSeq(charsets, ",") {
			switch strings.ToLower(cs) {
			case "utf8mb4", "utf8mb3", "utf8", "latin1", "ascii", "binary":
			default:
				return false
			}
		}
	}
	return true
}

// parseCluster reads [user:pass@]h1:p1,h2:p2[?param=…] (the parameters of
// redis.ParseClusterURL, and prefix and maxmemory_policy, as for redis://).
func parseCluster(scheme, rest string) (opts *redis.ClusterOptions, prefix, policy string, err error) {
	hosts, query, _ := strings.Cut(rest, "?")
	userinfo := ""
	if i := strings.LastIndexByte(hosts, '@'); i >= 0 {
		userinfo, hosts = hosts[:i+1], hosts[i+1:]
	}
	hosts = strings.TrimSuffix(hosts, "/")
	if hosts == "" {
		return nil, "", "", fmt.Errorf("redis+cluster:// needs at least one host:port, as in redis+cluster://127.0.0.1:7000,127.0.0.1:7001")
	}
	addrs := strings.Split(hosts, ",")
	for _, a := range addrs {
		if _, port, ok := strings.Cut(a, ":"); !ok || port == "" || a == "" {
			return nil, "", "", fmt.Errorf("cluster node %q is not host:port", a)
		}
	}
	base := "redis"
	if strings.HasPrefix(strings.ToLower(scheme), "rediss") {
		base = "rediss"
	}
	q := url.Values{}
	if query != "" {
		if q, err = url.ParseQuery(query); err != nil {
			return nil, "", "", err
		}
	}
	if prefix, err = popParam(q, "prefix", "idem"); err != nil {
		return nil, "", "", err
	}
	if policy, err = popParam(q, "maxmemory_policy", policyDefault); err != nil {
		return nil, "", "", err
	}
	for _, a := range addrs[1:] {
		q.Add("addr", a)
	}
	u := base + "://" + userinfo + addrs[0]
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	opts, err = redis.ParseClusterURL(u)
	return opts, prefix, policy, err
}

// Redact returns rawURL with any password replaced by "xxxxx", for logs
// and error messages.
func Redact(rawURL string) string {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		if i := strings.LastIndexByte(rawURL, '@'); i >= 0 {
			return "xxxxx" + rawURL[i:]
		}
		return rawURL
	}
	auth, tail := rest, ""
	if i := strings.IndexByte(rest, '?'); i >= 0 {
		auth, tail = rest[:i], rest[i:]
	}
	// Query parameters may carry a password too (password=…).
	if tail != "" {
		if q, err := url.ParseQuery(tail[1:]); err == nil && q.Has("password") {
			q.Set("password", "xxxxx")
			tail = "?" + q.Encode()
		}
	}
	if at := strings.LastIndexByte(auth, '@'); at >= 0 {
		if user, _, hasPass := strings.Cut(auth[:at], ":"); hasPass {
			auth = user + ":xxxxx" + auth[at:]
		}
	}
	return scheme + "://" + auth + tail
}

// redactErr removes the URL's password from a parser's error message.
func redactErr(err error, rawURL string) string {
	msg := err.Error()
	if u, perr := url.Parse(rawURL); perr == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	scheme, rest, _ := strings.Cut(rawURL, "://")
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		if _, p, ok := strings.Cut(rest[:at], ":"); ok && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	_ = scheme
	return msg
}

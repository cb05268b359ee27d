// Package idemredis keeps idem's idempotency records in Redis, on a single
// node or a Redis Cluster, through rueidis (github.com/redis/rueidis),
// whose auto-pipelining sends the scripts of concurrent requests together.
//
// # Where to start
//
// Pass your own rueidis client and a Config to [New]. rueidis finds out
// whether InitAddress names Cluster nodes or a single node:
//
//	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs})
//	...
//	store, err := idemredis.New(client, idemredis.Config{Prefix: "payments"})
//
// then hand the store to the engine (idem.NewEngine). Every state change
// and every read by key is a script, which goes to the master that owns the
// record's slot. The rest of this comment explains how records are kept,
// what listing costs, and, before you put payments on it, how durable
// Redis is.
//
// # Coming from go-redis
//
// The redis:// and rediss:// URLs that go-redis's redis.ParseURL reads
// ([user:pass@]host:port/db) become a rueidis.ClientOption with
// rueidis.ParseURL (or rueidis.MustParseURL):
//
//	opt, err := rueidis.ParseURL("redis://:secret@10.0.0.5:6379/0")
//	...
//	client, err := rueidis.NewClient(opt)
//
// For a Cluster, where go-redis takes ClusterOptions{Addrs: addrs}, set
// ClientOption{InitAddress: addrs}, with the same Username, Password and
// TLSConfig. rueidis.ParseURL knows db, dial_timeout, write_timeout,
// protocol, client_name, skip_verify, addr (more seed addresses) and
// max_retries=0; it ignores the pool and read-timeout parameters, which have
// no counterpart: rueidis pipelines over a few connections per node
// instead of keeping a pool. Three differences matter here:
//
//   - rueidis connects in NewClient, and fails there if the server cannot
//     be reached; go-redis connects on first use.
//   - rueidis retries read-only commands (the SCAN, GETRANGE and GET of
//     the listings, not the scripts: see Lost replies) until ctx ends, unless
//     ClientOption.DisableRetry is set or ClientOption.RetryDelay returns a
//     negative delay after a number of attempts.
//   - rueidis finds out whether a single address is a Cluster member; set
//     ForceSingleClient to keep a redis:// client on that one node. Set
//     DisableCache for servers older than Redis 6 (this package never uses
//     client-side caching).
//
// idem's own store URLs (internal/storeurl, behind idem serve --store) are
// still read by go-redis's parsers, with every parameter they accept, and
// turned into a ClientOption: address or seeds, user, password, db, TLS,
// dial_timeout, the larger of read_timeout and write_timeout
// (ConnWriteTimeout), client_name, protocol, and max_retries, which sets
// both Config.Resends and how often rueidis retries a read (3 by default,
// none at -1). The pool parameters, read_only, route_by_latency and
// route_randomly have no effect: the store reads from masters only.
//
// # Layout
//
// A record is one string, "<prefix>:{<tag>}:r". The hash tag is the hex
// SHA-256 of the length-prefixed scope, operation and key, so client strings
// containing '|', '{' or '}' can neither collide nor break the tag, and a
// Cluster spreads records evenly over its slots. The string holds, in a
// compact binary layout (record.go), a fixed head (state, lease deadline,
// the times, the id of the last call that changed it), the token, the
// original scope, operation and key (checked whenever a record is read by
// key), the fingerprint, the encoded request (idemstore.EncodeRequest), the
// scope label (layout 2), the review reason and the stored answer. The
// record's notification channel, "<prefix>:{<tag>}:n", and its
// short-lived tombstone, "<prefix>:{<tag>}:g"
// (see Errors below), share the tag and therefore the slot, so nothing the
// store does ever crosses slots. The search indexes of the record's slot
// (see Search) are named after another tag that hashes to the same slot.
//
// Each read by key and each state change (reserve, get, complete, release,
// escalate, extend, takeover, resolve, delete) is one Lua script, sent with
// EVALSHA (EVAL when the node does not know it yet): one round trip,
// atomic, fenced by the token. Reserve creates the record only if the key
// is absent (SET NX) and otherwise returns the existing record from the
// same script, so the contract's retry loop is never needed.
//
// # Upgrading from hash records
//
// Earlier versions kept each record as a hash with one field per part.
// This version reads those records for as long as they exist, in every
// script and listing, so an upgrade in place needs no migration: a pending
// or needs_review hash is rewritten in the new layout by the first change
// this version makes to it, and a completed hash stays until its TTL or
// Purge removes it. While processes of both versions share a Redis (a
// rolling upgrade), a process of the earlier version fails on records in
// the new layout before it changes anything (a retry of such a key gets an
// error from it instead of running; its listings, Purge and recovery,
// which SCAN only hashes, pass them by), and a process of this version
// never rewrites a hash that an earlier process may still settle (see
// legacy.go). Recover expired leases and purge from upgraded processes.
//
// # Time
//
// Time belongs to the server. Every script that sets or judges a deadline
// reads the clock of the node that holds the record with TIME, in the same
// atomic step: the lease deadline of Reserve, Extend and Takeover, the
// expiry checks of Takeover and of Release and Escalate with IfExpired, the
// expiry of Complete and Resolve, and Purge's test of it. Get returns the
// record with the TIME read in the same script as its ReadAt; List and
// ListExpiredLeases send TIME first in the pipeline that reads a node's
// records. Hosts with skewed clocks therefore agree on every lease, and an
// Extend that lands first beats a later takeover, release or escalation of
// the expired lease. Scripts must be replicated by their effects, as they are
// by default since Redis 5.0 and always since 7.0 (which sharded pub/sub
// needs anyway).
//
// Times are kept as Unix microseconds. The lease deadline is a field, not a
// TTL, so an expired lease is told apart from a missing record. A completed
// record keeps expires_at (now + retention) as a field and gets a Redis TTL
// of the retention (counted as zero when it is negative) plus
// Config.RetentionGrace; a relative TTL (PEXPIRE) lets Redis's clock only
// measure a duration. Purge removes completed records whose expires_at has
// passed; the TTL cleans up after stores nobody purges. Reserve returns a
// completed record whose retention is over as long as it is there, as the
// SQL stores do until their Purge runs. Pending and needs_review records
// never expire on their own.
//
// Hash records written before updated_at and the request were kept read
// with UpdatedAt equal to CreatedAt and no Request.
//
// A reserve and a complete are two round trips and two scripts: Reserve
// runs TIME, SET NX and two ZADD of the search indexes, Complete TIME,
// GETRANGE (the record's head), SET and a ZADD, with PUBLISH only when
// someone waits (see Notifications and Search). The
// server's cost of a script is mostly the call itself and the bytes that
// pass through Lua, so the scripts take few arguments and never copy a
// large answer or stored request twice (see scripts.go). rueidis pipelines
// the scripts that concurrent requests send at the same moment into one
// write and one read per connection, which spares the server (and the
// client) most of the system calls a round trip costs; its
// ClientOption.MaxFlushDelay (idem serve sets 20µs) lets a busy client
// gather more of them per write. See BENCHMARKS.md and
// scripts/bench-redis.sh for the pair rate against redis-benchmark's SET
// NX on the same servers and the server's CPU time per pair. A lone
// request pays one round trip per script, as without pipelining.
//
// The store reads large answers apart (idemstore.ResponseReader and
// idemstore.HeadReader): with ReserveParams.InlineResponse, Reserve's
// script reads an existing record's head and the lengths of its fields
// (GETRANGE) and the answer's size (STRLEN; HSTRLEN for a hash of an
// earlier version) and returns the record without an answer longer than
// the limit, still in one round trip; GetHead does the same for Get.
// ReadResponse then returns only the answer, in one script that checks
// that the record is still completed under the token read (a record whose
// retention is over is read as long as it is there, as Reserve returns
// it).
//
// # Listing and its cost
//
// A List without a search field, ListExpiredLeases and Purge SCAN every
// master (on a Cluster, the masters that CLUSTER SLOTS names, each through
// the client's own connection to it) with MATCH "<prefix>:{*}:r", so they
// also see records that no index holds yet (see Upgrading to the search
// indexes). The listings read each batch's states, lease deadlines and
// operations (the filters) with one pipelined GETRANGE of a record's first
// 512 bytes per key after the node's TIME (HMGET for a hash of an earlier
// version, GET for a record whose operation ends further on), and whole
// records (responses and requests included) only for those they return;
// Purge sends one conditional-delete script per scanned key, which reads
// only the record's head, pipelined in BatchSize chunks, and then sweeps
// the search indexes (see below). The cost falls on the listing side:
//
//   - SCAN walks every key of every master, idem's or not; MATCH filters on
//     the server. A full pass over N keys takes about N/ScanCount SCAN calls
//     per master plus one small pipeline per batch.
//   - ListExpiredLeases and Purge make one full pass each. ListExpiredLeases
//     returns the oldest deadlines first, so it cannot stop early; it keeps
//     no more than twice limit candidates while it scans. Run them from one
//     recovery loop, not per request.
//   - A List page resumes where the previous one stopped, re-reading at most
//     one SCAN batch. Records come in SCAN order (by master, then batch, then
//     key name), not sorted by scope, operation and key. As with SCAN itself,
//     a record that exists for the whole listing is returned, a record
//     created or deleted meanwhile may or may not be, and a failover or
//     resharding during a listing can make it repeat or skip records, or
//     fail (the caller starts again).
//
// # Search
//
// The store searches (Capabilities.Search: a key by its value or a prefix
// of it across scopes, a scope label, an age, a reason, every state by age)
// and counts (idemstore.Counter) through sorted sets that the scripts
// which change records keep in the same atomic step (index.go):
//
//	ik  every record, score 0, member key\0scope\0operation
//	ia  every record, member scope\0operation\0key, scored by created-at
//	    (in Unix microseconds), less 2^52 while the record is pending
//	iv  needs_review records, as ia
//	il  labelled records, score 0, member label\0scope\0operation\0key
//
// (each part escaped so that NUL separates them and byte order is kept).
// A search by key or prefix is a ZRANGEBYLEX of ik, which lists in the
// order idemstore.OrderKey asks for with Key set (key, scope, operation),
// in O(log N + page) whatever N; a label is a ZRANGEBYLEX of il; the review
// queue, oldest first, a ZRANGEBYSCORE of iv, pending records by age one
// of ia below 0, completed ones one of ia from 0 on (with the records in
// review, filtered out), every state both ranges merged; a search by age
// with a key, prefix or label reads their matches' ages from ia (ZMSCORE)
// and sorts them. A search in key order by neither key nor label (an age
// or a reason alone) lists pending or review records by scope, operation
// and key, but completed records, or every state, in the key index's
// order (key, scope, operation), as a search by key does: the store keeps
// no index of them by scope. Each listed record is then read whole by the
// get script. Sorted sets were chosen over RediSearch (a module many
// deployments lack, which indexes hashes and JSON documents, not this
// store's binary strings) and over one set per key value or label (a key
// per record more, and no prefix search). Members carry the key's
// parts, so a search finds the records' names (the hash tag) without
// reading anything else, and Counts reads operations and ages from ia's
// pending range and iv alone. Pending records are a range of ia rather
// than a set of their own because that spares a command per request: a
// set of pending records would cost an add at Reserve and a removal at
// Complete, where the range costs Complete one ZADD that moves the score.
//
// A script may only touch keys of its record's slot. On a Cluster each of
// the 16384 slots therefore has its own four sets, named
// "<prefix>:{<tag>}:i<letter>" with a short tag that hashes to that slot,
// and a search asks every slot, pipelined (rueidis sends each command to
// the master of its slot), and merges the answers: first each slot's first
// match, then, from the slots that have any, the matches up to the k-th
// first (see walk in search.go). That is some 16384 small commands a
// round, whatever the number of records: 100 to 250 ms a search on the
// test Cluster, against a millisecond or two on a single node
// (BENCHMARKS.md). On a single node (or behind Sentinel) there is one group of
// sets, that of slot 0. Moving records between a single node and a Cluster
// therefore needs Reindex.
//
// On the hot path, Reserve adds a record to ik and ia (and il with a
// label): two ZADD more in its script; Complete moves its score in ia to
// its created-at (one ZADD XX, which leaves out a record that no index
// holds yet); Escalate adds it to iv and moves it likewise; Resolve,
// Release and Delete take it out. Nothing else changes, and each call is
// still one script and one round trip. scripts/bench-redis.sh and INFO commandstats measure the
// server's time per reserve+complete pair (BENCHMARKS.md).
//
// A completed record ends by its TTL without a script, so its entries in
// ik, ia and il stay behind it. A search filters every record it reads
// against the search (so such entries are never listed), and drops the
// entries of records it finds gone with a script that checks again
// atomically (fixScript); Purge sweeps the rest: it reads ik and il of
// every group, pipelined, asks EXISTS of each record and drops the entries
// of those that are gone, and checks ia's pending range and iv whole. The
// sets therefore hold at most the records of the last Purge interval more
// than the store does. Counts takes pending and review counts from them exactly, and
// completed ones from ZCARD of ia less those: up to
// idemstore.ExactCountLimit it checks that each still exists, past it the
// figure (which may include records whose TTL ran out since the last
// Purge) is reported as an estimate.
//
// # Upgrading to the search indexes
//
// Records written by earlier versions have no index entries, so searches
// and Counts miss them (plain listings, recovery, Purge and every read by
// key still see them). [Store.Reindex], which `idem migrate --store
// redis://…` runs, walks the keyspace by SCAN and puts every record into
// the sets its state calls for, in batches, reporting its progress; it is
// idempotent and safe while the store serves, since records that change
// meanwhile are indexed by the scripts that change them. Run it once after
// every process runs this version (records that a process of the earlier
// version reserves during a rolling upgrade have no entries either), and
// after moving records between a single node and a Cluster. A record keeps
// ReserveParams.ScopeLabel in layout 2 of the string (record.go); a record
// without a label stays in layout 1, which processes of the earlier version
// read, so a deployment that sets no label keeps rolling upgrades working.
//
// # Notifications
//
// The store implements idemstore.Notifier. The complete, release,
// escalate, takeover, resolve and delete scripts publish on the record's
// channel with SPUBLISH (sharded pub/sub, Redis 7.0 or later), so on a
// Cluster the message travels only within the shard that owns the record;
// [Config.ClassicPubSub] switches to PUBLISH/SUBSCRIBE for older servers
// (5.0 or later, see Time). A subscription marks the pending record as
// waited for, and the scripts that settle a pending record publish only
// when it is marked, so the many records nobody waits for cost no publish
// (Resolve and Delete always publish). Each subscription holds a dedicated
// connection while it lasts; when that connection breaks, the subscription
// ends and its channel is closed. A notification is a hint: waiters still
// poll.
//
// # Eviction: maxmemory-policy must be noeviction
//
// Redis is often run as a cache, and a cache evicts. Under memory
// pressure, the volatile-* policies (volatile-lru, the default of
// ElastiCache, Memorystore, Azure Cache for Redis and Redis Cloud, and the
// other volatile ones) evict keys that carry a TTL, as every completed
// record does; the allkeys-* policies evict any key, pending and
// needs_review records too. A record evicted before its retention is a key
// the next retry reserves anew: the operation runs twice. Only noeviction
// never evicts: a full server refuses writes with OOM, which the store
// reports as idemstore.ErrUnavailable, so a new key gets 503 and nothing
// runs twice (a completed key still replays, as replays only read).
//
// So [New] reads maxmemory-policy from every node with CONFIG GET (on a
// Cluster, every master that serves slots and every other node the client
// knows, as a replica's policy takes effect when it is promoted) and fails
// with an error wrapping [ErrEvictionPolicy] unless every one is
// noeviction, whatever maxmemory says: a limit of 0 never evicts, but
// CONFIG SET maxmemory evicts down to a new limit at once. There is no
// option to accept another policy. Managed services disable CONFIG; there,
// [Config.MaxmemoryPolicy] states the policy (noeviction, once it is set
// in the service's console), New trusts it and logs a warning that it
// could not verify it, and without it New fails with [ErrPolicyUnknown].
//
// The policy can change after New (CONFIG SET, a parameter group, a
// failover to a replica configured otherwise, a master added to the
// Cluster). [Store.CheckPolicy] reads it again; ListExpiredLeases and
// Purge call it before they scan, so the engine's Recover and Purge loops
// check as often as they run (idem serve: every minute). While the last
// check found a node that can evict, Reserve and Takeover fail with
// idemstore.ErrUnavailable (503) and the change is logged at ERROR; they
// resume once a check finds every node at noeviction again. Between a
// change and the next check, the store does not know. A proxy in front of
// Redis answers CONFIG GET for itself, if at all; state the policy there.
//
// docs/redis.md in the repository lists the defaults of the common managed
// services and how to set noeviction on each.
//
// # Durability: read this before storing payments
//
// Redis acknowledges a write once it is in memory. What survives a crash is
// decided by the server's persistence settings, not by this package:
//
//   - appendonly no (the Redis default, with or without RDB snapshots): a
//     crash loses every write since the last snapshot, possibly minutes.
//   - appendonly yes, appendfsync everysec: a crash of the machine (or of
//     Redis before its background fsync) loses up to about one second of
//     acknowledged writes. A key reserved just before the crash may vanish,
//     so a retry reserves it again and the operation runs a second time. A
//     completion may vanish too: the record is pending again, and once its
//     lease expires a retry takes it over and runs the operation again (an
//     external operation goes to needs_review instead); if the reservation
//     was lost as well, the retry simply runs it again.
//   - appendonly yes, appendfsync always: every write is fsynced before the
//     reply, so an acknowledged reserve or complete survives a crash of the
//     node, at the price of one fsync per state change.
//
// Replication is asynchronous. When a master fails and a replica is promoted
// (Sentinel or Cluster failover), writes the master acknowledged but had not
// yet sent to that replica are lost, with the same consequences as above,
// whatever appendfsync says. WAIT (replicas) and WAITAOF (Redis 7.2+, local
// and replica fsync) after a state change narrow that window but do not make
// Redis a consensus store; this package does not issue them. A manual
// CLUSTER FAILOVER (without FORCE) waits for the replica to catch up and
// loses nothing.
//
// For payments and other operations that must not run twice, idem
// recommends either appendonly yes with appendfsync always on every master
// and replica, accepting that a failover can still lose recent writes, or a
// SQL store (idempg, idemmysql), whose CompleteTx also commits the answer
// with the business change. Redis with appendfsync everysec suits
// operations where a rare second run is tolerable (e-mails, idempotent
// upstreams, deduplication).
//
// # Errors
//
// Errors wrap the idemstore sentinels: a missing record is
// idemstore.ErrNotFound, a failed fence idemstore.ErrLeaseLost, a Resolve
// or Delete of a record in the wrong state idemstore.ErrNotNeedsReview or
// idemstore.ErrNotCompleted, and a closed
// client, a refused connection, CLUSTERDOWN, LOADING, READONLY (a write that
// reached a demoted master), OOM (a full server under noeviction refuses a
// script at its first write that could grow memory, before it changes
// anything; the scripts that delete first, Release and Purge, still run)
// and similar are idemstore.ErrUnavailable. (Escalate adds the record to
// the review set before it moves its score in the set by age for the same
// reason: once a script has written, Redis lets the rest of it write.)
// Context cancellation and deadlines remain recognisable with errors.Is.
//
// # Lost replies
//
// When the connection breaks or times out after a script was sent, its
// reply is lost and the script may or may not have run. The store sends it
// again on a new connection, up to Config.Resends times (3 by default),
// pausing 8ms and doubling up to 512ms between attempts, while ctx lasts;
// rueidis itself retries only read-only commands (the SCAN, GETRANGE and
// GET of listings), and never a script. So a script can run twice for one call.
// Every changing script recognises its own earlier run and reports success
// instead of a lost lease or a missing record: Reserve by its unique token,
// the others by a random call id that the script stores in the record
// (Complete, Escalate, Takeover, Resolve) or, when it deletes the record
// (Release, Resolve with release, Delete), in the record's tombstone, which
// expires after five minutes. This covers Release and Escalate with
// IfExpired too. Only a resend that finds the record changed again by
// someone else since its first run (released and reserved anew, for
// instance) reports what it finds. Set Config.Resends to -1 to get
// ErrUnavailable instead of a resend.
//
// A call returns as soon as its ctx ends, except Reserve and Takeover:
// rueidis still sends a script it has queued for a caller that gave up,
// and the engine then releases the token that may have been granted. So
// that this release cannot reach the server first over another
// connection, Reserve and Takeover wait up to a second more for their
// script's reply before they return ctx's error.
package idemredis

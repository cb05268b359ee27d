// Package capacity measures what docs/capacity.md sizes idem from: the
// bytes a completed record takes in each store (with a 1 KiB and a 16 KiB
// answer, and with the request body stored), and what purging expired
// records costs (wall time, and CPU time in the client and in the store's
// server), per million records.
//
// It is all tests. TestCapacity loads records shaped like a real client's
// (UUID keys, a 64-hex-digit keyed-digest scope, a JSON POST of about 200
// bytes) into memory, SQLite, PostgreSQL, MySQL and Redis, and prints a
// table; it skips unless IDEM_BENCH_CAPACITY=1, so that make test stays
// fast. BenchmarkStorePairs times reserve+complete pairs on any store URL
// (IDEM_CAPACITY_STORE_URL) and, on Redis, the servers' CPU per pair.
// scripts/bench-capacity.sh runs both, with the load runs behind idem
// serve that the guide needs as well.
package capacity

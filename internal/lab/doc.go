// Package lab runs the claims idem's design rests on against a real
// database and counts what happens. It is the engine of "idem lab".
//
// Three strategies for "run this once per key" race, each played by N
// workers on one fresh key per round, at each isolation level:
//
//   - check-then-insert: SELECT the key, INSERT it if absent, commit;
//   - select-for-update: SELECT … FOR UPDATE, then INSERT if absent, in
//     one transaction (SQLite has no FOR UPDATE: BEGIN IMMEDIATE instead);
//   - insert-first: INSERT against a unique key and let the database pick
//     the one winner, as idem's stores reserve a key.
//
// A worker that believes it won, because its transaction committed with its
// row in it, "executes" the operation; executions are counted per key. The
// first two strategies run on a table whose key column has a plain index
// and no unique constraint (what a team that trusts its check has), so the
// duplicates they let through are counted, not hidden; insert-first runs on
// a table whose primary key is the key.
//
// Start with Run; Report formats the results. The lab works only on scratch
// tables it creates (idem_lab_<random>_check and _insert) and drops them
// when it ends, also on error or cancellation; idem's own tables are never
// touched.
package lab

// Package idemvet is a static analyzer that finds what idem should protect
// but does not: HTTP routes for POST and PATCH that no idem middleware
// wraps, and SQL that reserves a key the way that lets duplicates through.
//
// Run it with the idem command, or as a vet tool:
//
//	idem vet ./...
//	go install github.com/idem-dev/idem/cmd/idem-vet@latest
//	go vet -vettool=$(which idem-vet) ./...
//
// # Routes
//
// A route is a call that registers a handler:
//
//   - http.Handle, http.HandleFunc and (*http.ServeMux).Handle/HandleFunc
//     with a method pattern ("POST /payments"), or with a plain pattern
//     whose handler compares r.Method with POST or PATCH
//     (r.Method == http.MethodPost, r.Method != "POST", a switch);
//   - chi's Post and Patch, Method and MethodFunc ("POST", …), and Handle
//     and HandleFunc with a method pattern or a method check, on a
//     chi.Router or *chi.Mux (github.com/go-chi/chi/v5, or v1 to v4).
//
// It is protected when its handler, or a router above it, passes through
// idem's middleware: a value made by idem.Middleware or idem.NewMiddleware,
// followed through variables, struct fields, function parameters, functions
// that return it (across packages, as analysis facts), and middleware that
// calls it. "A router above" means, for chi, Use on the router or on any
// router it was made from (With, Group, Route, Mount, or passed to a
// function of the same package); for a ServeMux, the mux (or a mux that
// serves it) passed to the middleware anywhere in the package, as in
// http.ListenAndServe(addr, mw(mux)). An unprotected route is reported as
//
//	POST /payments: mutating route without idempotency protection
//
// Only POST and PATCH are reported, the methods idem's middleware protects
// by default; PUT and DELETE are idempotent if they overwrite or delete by
// ID (see docs/what-needs-protection.md). Test files and generated files
// are not checked.
//
// Limits: the analysis is per package and by name, not a whole-program
// data flow. A mux wrapped in another package than the one that registers
// its routes, middleware chosen at run time (from a map, a config switch),
// routers other than net/http and chi (gorilla/mux, echo, gin), and
// patterns built at run time are not followed. A route it cannot judge is
// not reported, except when its handler visibly checks for POST or PATCH.
//
// # SQL
//
// In each function, string constants that hold SQL are read in order:
//
//   - a SELECT … FOR UPDATE (or FOR NO KEY UPDATE, FOR SHARE, LOCK IN SHARE
//     MODE) on a table, followed by an INSERT into the same table, is
//     reported: a row that does not exist yet cannot be locked, so two
//     requests both find nothing and both insert (PostgreSQL READ
//     COMMITTED), or deadlock on gap locks (InnoDB REPEATABLE READ);
//   - a SELECT on a table whose name contains "idempot", followed by a
//     plain INSERT into it (no ON CONFLICT, ON DUPLICATE KEY, INSERT
//     IGNORE, INSERT OR …, REPLACE or UPSERT), is reported as
//     check-then-insert: both requests read no row before either inserts.
//
// The fix is the one rule idem rests on: reserve first, by INSERT against a
// unique constraint, and read the existing row only on conflict. See
// https://github.com/idem-dev/idem/blob/main/docs/why-insert-first.md.
//
// # Suppressing a report
//
// A comment //idem:ignore followed by a reason, on the reported line or
// the line above, suppresses the reports on that line:
//
//	//idem:ignore the webhook is deduplicated by the provider's event ID
//	mux.HandleFunc("POST /webhooks/stripe", stripeWebhook)
//
// An //idem:ignore without a reason suppresses nothing and is itself
// reported.
package idemvet

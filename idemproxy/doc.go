// Package idemproxy is idem's reverse proxy: it puts the Idempotency-Key
// guarantee in front of any HTTP API, whatever its language. `idem serve`
// (internal/cli) runs it.
//
// Start with Server, which wires a store, an engine, the listeners, the
// recovery and purge loops and graceful shutdown; New builds the handler
// alone. The protocol itself is idem's middleware (idem.NewMiddleware)
// wrapped around an httputil.ReverseProxy, one middleware per configured
// route (Config.Routes, matched by an http.ServeMux), all sharing one
// engine. This package adds only what a proxy must decide:
//
//   - the scope: a digest of the values of the scope headers and cookies
//     (NewScope), keyed with HMAC-SHA-256 when a secret is set, never the
//     credential itself; a request without any of them gets 401; the scope's
//     headers and cookies reach the upstream whatever Connection says;
//   - the operation: method and path, the path normalised as the upstream
//     reads it and forwarded so (path.go), the authority the client
//     addressed, normalised as a host (Settings.HostAliases makes hosts one),
//     and the upstream's name (identity.go); records stored under an
//     earlier version's name keep it (Config.LegacyOperations); a protected method in another
//     case, or named by an override header, is refused or protected, never
//     passed on unprotected (route.go, override.go), and a protected
//     request never becomes a tunnel;
//   - the client's edges: writes to a slow client are bounded, and one that
//     does not take its answer is cut off rather than let hold a key; the
//     request bodies held in memory, and the connections, are bounded
//     (clientwrite.go, budget.go);
//   - upstream failures, which the forwarder settles itself: a request that
//     never left (a dial, DNS or TLS error, or no byte of it reached the
//     connection, as traced with httptrace) gets 502 and its key is
//     released; one that failed after it was sent, whose answer was cut
//     short (watched on the upstream body itself, with or without an
//     http.Server around the proxy), or that ran past the route's
//     UpstreamDeadline has an unknown outcome: it gets 502 (504 on timeout,
//     an aborted response once part of the body went out) and its key goes
//     to needs_review, or is released when the route's Ambiguous policy
//     says the upstream is itself idempotent. If the store refuses the
//     release or escalation, the lease is abandoned: the key stays pending
//     for recovery, and the proxy's own problem document is never stored;
//   - growth per client: with Settings.NewKeysPerScope, a scope's new keys
//     past its cap are released as they are reserved, before anything is
//     forwarded, and get 429 (keycap.go); replays never count;
//   - shutdown: requests not yet forwarded are released and get 503.
//
// The configuration file is YAML (LoadConfig); docs/proxy.md describes it.
package idemproxy

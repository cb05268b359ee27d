// Package idemclient is the client side of idempotency keys: an
// http.RoundTripper that gives each POST and PATCH an Idempotency-Key and
// retries it, with the same key, until it gets an answer it can trust.
//
// A server that honours keys (idem's middleware, idem serve, or any server
// following the IETF Idempotency-Key draft) runs an operation at most once
// per key and gives every retry the first answer. That only helps if the
// retry carries the same key: a client that makes a new key for each attempt
// turns a safe retry into a second charge. Transport keeps the key for every
// attempt of a request.
//
//	client := &http.Client{Transport: &idemclient.Transport{}}
//	resp, err := client.Post(url, "application/json", body)
//	// idemclient.Replayed(resp): the answer is a replay of an earlier attempt's
//	// idemclient.KeyOf(resp): the key the request carried
//
// # Which key
//
// One key stands for one logical operation, for as long as anyone might
// retry it:
//
//   - A random key (NewKey, a UUIDv7, the default) when the operation is
//     new each time it is asked for: "charge this cart now". Transport makes
//     one per request and keeps it across its own retries. If your program
//     retries beyond the Transport (a queue job that runs again, a user who
//     clicks again), make the key once, store it with the operation, and
//     pass it with WithKey on every try.
//   - A derived key (KeyFrom) when the operation is unique by its content
//     and whoever retries it can compute the key again from the same parts:
//     "pay invoice in_42", "send the welcome mail to user 7". Name the
//     operation and every part that makes it unique, never parts that
//     change between tries (timestamps, attempt numbers). Do not derive
//     keys from secrets you would not put in a log.
//
// Transport retries network errors, 409 in flight (after Retry-After), 429
// and 503 (after Retry-After when given) and 502 and 504, with exponential
// backoff and full jitter, bounded by MaxAttempts, MaxElapsed and the
// request's context. A 400, a 422, or a 409 that is not "in flight" (idem's
// needs-review and not-replayable) is returned as an *Error carrying the
// RFC 9457 problem document: retrying cannot change it.
package idemclient

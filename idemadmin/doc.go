// Package idemadmin is idem's admin API and review page: where a person
// finds the keys whose outcome is unknown (needs_review) and settles them.
//
// Handler serves both on the admin listener of `idem serve`:
//
//   - the JSON API under /api/v1/keys (list, get, resolve, delete), for
//     scripts and `idem review` / `idem keys --admin-url`, authorized by
//     "Authorization: Bearer TOKEN";
//   - the review page at /, server-rendered with html/template from
//     embedded files: sign in with a token, see the queue, open a key, and
//     release it or store its answer, each behind a confirmation and
//     protected against cross-site request forgery.
//
// A sign-in is a cookie (HttpOnly, SameSite=Strict) signed with a key
// derived from the token, never the token itself: every instance with the
// same token file accepts it, so an operator signs in once for a fleet
// behind one load balancer. Signing out revokes the session in the shared
// store (SessionScope), for every instance. Wrong tokens are counted per
// client address (an IPv6 one by its /64, Config.SignInIPv6Prefix) and,
// past Config.SignInFailures, refused for a while; an address that gave
// no wrong token is never refused.
//
// Every change names the attempt of the key the operator looked at
// (Item.Attempt), and applies to that attempt only: a key that went to
// review again, or whose answer was deleted and stored anew, since it was
// read is left alone (409 stale_attempt). The page always sends the
// attempt it showed; through the API, AnyAttempt acts on whichever attempt
// holds the key.
//
// Keys is the same logic without HTTP, for tools that open a store
// directly, and Client speaks the API. Every change is logged with the
// name of the token that made it and the operator's note, and a completed
// key's reason says the same. docs/admin-api.md describes the API.
package idemadmin

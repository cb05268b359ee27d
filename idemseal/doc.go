// Package idemseal seals idem's stored answers at rest, with AES-256-GCM.
//
// Start with a [Keyring], from a key file or an environment variable:
//
//	ring, err := idemseal.LoadKeyFile("/etc/idem/encryption.keys")
//	...
//	eng, err := idem.NewEngine(store, idem.EngineConfig{Sealer: ring})
//
// The engine then seals every answer before it reaches the store (headers
// and body; the status stays in clear) and the query and body of the
// request it keeps for operators, and opens them when it reads them back,
// on every path: Complete, CompleteTx, resolutions, replays, CheckTx,
// recovery. A dump of the store shows no answer body or header. Give the
// same Keyring to idemadmin.Config.Sealer, so that the review page shows
// what it can open and seals the answers operators store.
//
// Each sealed part names the key that sealed it, so keys can be rotated:
// put a new key first in the file (it seals from then on) and keep the old
// ones after it (they still open what they sealed) until the records they
// sealed have expired, after the retention window. A sealed part is bound
// to its record's scope, operation and key, and to what stays in clear
// (the status; the method and path), as associated data: an answer copied
// to another key, or given another status, does not open. Neither does one
// whose key is not in the ring. The engine never replays such an answer as
// it is, and never runs its operation again: it returns an error wrapping
// idemstore.ErrSealed.
//
// # Key file
//
// One key a line; blank lines and lines starting with # are ignored:
//
//	# the first key seals; every key opens
//	2026-03:q0b5dHq8w8B0fEBr6gNwJ8mXkW2Jd3yq1mQ9o6vJ3Ck=
//	2025-11:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//
// A line is [ID:]SECRET. SECRET is 32 random bytes, in standard base64
// (`openssl rand -base64 32`) or as 64 hex digits (`openssl rand -hex 32`).
// ID names the key in every sealed part (1 to 64 letters, digits, '.', '_'
// or '-'); without one, the ID is derived from the secret ("k" and 8 hex
// digits of a hash). [ParseKeys] reads the same format from a string, with
// commas also separating keys, for an environment variable such as
// IDEM_ENCRYPTION_KEY.
//
// AES-GCM with random 96-bit nonces stays safe for about 2^32 seals under
// one key: rotate well before a key has sealed four billion answers.
package idemseal

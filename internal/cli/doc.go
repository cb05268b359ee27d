// Package cli is the idem command line: the cobra commands behind
// cmd/idem. Start with NewRoot, which lists every command; serve.go runs the
// reverse proxy (package idemproxy), demo.go the self-contained quickstart,
// and migrate.go and purge.go the admin commands. Store URLs are turned into
// stores by internal/storeurl.
package cli

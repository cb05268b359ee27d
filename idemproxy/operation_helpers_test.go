package idemproxy_test

import (
	"context"
	"strings"

	"github.com/idem-dev/idem/idemstore"
)

// getRecord returns the record of key in scope whose operation is
// methodPath ("POST /pay") at any host and upstream, as the proxy names
// operations ("POST /pay host=… upstream=…"), or under the name alone.
func getRecord(ctx context.Context, st idemstore.Store, scope, methodPath, key string) (*idemstore.Record, error) {
	page, err := st.List(ctx, idemstore.ListParams{Key: key, Limit: 100})
	if err != nil {
		return nil, err
	}
	for _, rec := range page.Records {
		if op := rec.Key.Operation; rec.Key.Scope == scope && (op == methodPath || strings.HasPrefix(op, methodPath+" host=")) {
			return st.Get(ctx, rec.Key)
		}
	}
	return nil, idemstore.ErrNotFound
}

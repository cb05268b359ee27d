package idem

import "context"

type leaseKey struct{}

// ContextWithLease returns a context that carries lease, for LeaseFrom.
// The middleware gives every handler it runs such a context; code that calls
// Engine.Begin itself (a job runner, a gRPC interceptor) can hand its lease
// down to the same store code this way.
func ContextWithLease(ctx context.Context, lease *Lease) context.Context {
	if lease != nil && lease.ctxUsed.CompareAndSwap(false, true) {
		// The first context of a lease lives inside it: no allocation on
		// the request path.
		lease.ctx = leaseContext{Context: ctx, l: lease}
		return &lease.ctx
	}
	return context.WithValue(ctx, leaseKey{}, lease)
}

// LeaseFrom returns the lease of the request being handled, or nil when the
// request is not protected (a GET, or an optional key that was not sent).
//
// A handler whose business data lives in the store's database passes it to
// the store's CompleteTx inside its own transaction, so the change and the
// stored answer commit together; the middleware then stores nothing itself.
func LeaseFrom(ctx context.Context) *Lease {
	l, _ := ctx.Value(leaseKey{}).(*Lease)
	return l
}

// Package frontdoors holds tested recipes for putting idem in front of the
// routers Go teams use (Gin, Echo, gorilla/mux, Fiber) and one table of
// outcomes driven through every front door: the HTTP middleware, the gRPC
// interceptor and the Connect interceptor give the matching answer to the
// same scenario. It is a module of its own, so that these frameworks never
// reach idem's own dependencies.
package frontdoors

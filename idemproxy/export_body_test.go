package idemproxy

// BodyMemoryUsed returns the bytes of max_body_memory held now.
func BodyMemoryUsed(p *Proxy) int64 { return p.bodies.Used() }

package idemnats

// DecodeAnswer is decodeAnswer, for the tests.
var DecodeAnswer = decodeAnswer

// SetServerVersion makes g take v for its server's version.
func SetServerVersion(g *Guard, v string) { g.serverVersion = func() string { return v } }

// VersionAtLeast is versionAtLeast, for the tests.
var VersionAtLeast = versionAtLeast

package idem

// ReadLimited exposes readLimited to the tests of the package's buffers.
var ReadLimited = readLimited

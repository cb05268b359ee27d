//go:build !race

package idemgrpc_test

// raceEnabled tells whether the tests run with the race detector, which
// allocates on its own.
const raceEnabled = false

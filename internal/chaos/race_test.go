//go:build race

package chaos_test

// raceEnabled tells whether this test runs with the race detector; the
// proxies are built the same way, which reuses the build cache.
const raceEnabled = true

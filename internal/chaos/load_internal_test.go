package chaos

import "testing"

// TestStoredStatus: a probe goes only to a key whose answer idem serve
// stored, never to one its answer released (429 and 503, its default
// release_statuses, and other 5xx).
func TestStoredStatus(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]bool{200: true, 201: true, 409: true, 422: true, 429: false, 500: false, 502: false, 503: false} {
		if got := storedStatus(status); got != want {
			t.Errorf("storedStatus(%d) = %v, want %v", status, got, want)
		}
	}
}

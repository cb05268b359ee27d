package skipped

import (
	"net/http"
	"testing"
)

// Test servers register what they like.
func TestRoutes(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", pay)
	_ = `SELECT 1 FROM idempotency_keys WHERE k = $1 FOR UPDATE`
	_ = `INSERT INTO idempotency_keys (k) VALUES ($1)`
}

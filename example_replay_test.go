package idem_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-dev/idem"
)

// A replay is an answer the retry can read: the first request accepted
// gzip and its answer was stored compressed; a retry that does not accept
// gzip gets it decoded, and one in another language than the answer was
// negotiated in (Vary: Accept-Language) is told so, 406, rather than
// given the French answer silently.
func ExampleConfig_maxDecodedReplay() {
	_, store, cleanup := openSQLite()
	defer cleanup()
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}
	mw := idem.Middleware(engine, idem.Config{Scope: idem.GlobalScope, MaxDecodedReplay: 1 << 20})
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Vary", "Accept-Encoding, Accept-Language")
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusCreated)
		zw := gzip.NewWriter(w)
		io.WriteString(zw, "paiement accepté")
		zw.Close()
	}))
	send := func(acceptEncoding string) *http.Response {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100}`))
		r.Header.Set("Idempotency-Key", "pay-1")
		r.Header.Set("Accept-Language", "fr")
		if acceptEncoding != "" {
			r.Header.Set("Accept-Encoding", acceptEncoding)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Result()
	}
	first := send("gzip")
	fmt.Println("first:", first.StatusCode, first.Header.Get("Content-Encoding"))
	retry := send("")
	body, _ := io.ReadAll(retry.Body)
	fmt.Printf("retry: %d %q %s\n", retry.StatusCode, retry.Header.Get("Content-Encoding"), body)

	r := httptest.NewRequest(http.MethodPost, "/payments", bytes.NewReader([]byte(`{"amount":100}`)))
	r.Header.Set("Idempotency-Key", "pay-1")
	r.Header.Set("Accept-Language", "en")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Println("in English:", w.Code, w.Header().Get("Idempotency-Outcome"))
	// Output:
	// first: 201 gzip
	// retry: 201 "" paiement accepté
	// in English: 406 not_acceptable
}

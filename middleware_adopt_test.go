package idem_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
)

// TestMiddlewareMismatchSaysRawBytes: a body without a JSON Content-Type is
// compared byte for byte, and the 422 says so; a JSON one is canonical.
func TestMiddlewareMismatchSaysRawBytes(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, idem.EngineConfig{}, paymentHandler)
	send := func(key, ct, body string) *httptest.ResponseRecorder {
		r := f.request(call{key: key, body: body})
		r.Header.Set("Content-Type", ct)
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		return w
	}
	send("form", "application/x-www-form-urlencoded", `{"a":1,"b":2}`)
	w := send("form", "application/x-www-form-urlencoded", `{"b":2,"a":1}`)
	if w.Code != 422 || !strings.Contains(w.Body.String(), "compared byte for byte") {
		t.Errorf("form body reordered: %d %s", w.Code, w.Body)
	}
	send("json", "application/json", `{"a":1,"b":2}`)
	if w := send("json", "application/json", `{"a":1,"b":3}`); w.Code != 422 || strings.Contains(w.Body.String(), "byte for byte") {
		t.Errorf("JSON body changed: %d %s", w.Code, w.Body)
	}
}

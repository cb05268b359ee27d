package idemredis

import (
	"bytes"
	"context"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/replaygate"
)

// TestReplayApartInRetentionGrace replays, through the middleware with a
// replay budget (as idem serve does), a large answer whose record is past
// its ExpiresAt but still kept for Config.RetentionGrace: Reserve still
// returns the completed record, as it does for the replay of a small
// answer or a read of the whole record, so ReadResponse must return its
// answer too; refusing it made every round of Begin find the same record
// and fail with ErrRetryable.
func TestReplayApartInRetentionGrace(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, standaloneClient(t))
	ctx := t.Context()
	eng, err := idem.NewEngine(s, idem.EngineConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	runs := newRunCounter()
	h := idem.Middleware(eng, idem.Config{Scope: idem.GlobalScope})(runs.handler(nil))
	if rec := post(h, "grace"); rec.Code != answer16k.Status {
		t.Fatalf("POST grace: %d %s", rec.Code, rec.Body)
	}
	// The retention ends; the key is kept for the grace that follows it.
	first := recordOf(t, s, "grace")
	ea := binary.BigEndian.AppendUint64(nil, uint64(time.Now().Add(-time.Second).UnixMicro()))
	if err := s.client.Do(ctx, s.client.B().Setrange().Key(s.recordKey(first.Key)).Offset(offExpiresAt).Value(string(ea)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	withGate := func(key string) *httptest.ResponseRecorder {
		r := httptest.NewRequestWithContext(replaygate.With(context.Background(), idem.NewBudget(1<<20)), http.MethodPost, "/charges", strings.NewReader(`{"amount":1}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	whole := post(h, "grace")
	apart := withGate("grace")
	for _, c := range []struct {
		name string
		rec  *httptest.ResponseRecorder
	}{{"read whole", whole}, {"read apart", apart}} {
		if c.rec.Code != answer16k.Status || c.rec.Header().Get("Idempotent-Replayed") != "true" || !bytes.Equal(c.rec.Body.Bytes(), answer16k.Body) {
			t.Errorf("retry in the retention grace, answer %s: %d, replayed %q, %d bytes: %.200s", c.name, c.rec.Code, c.rec.Header().Get("Idempotent-Replayed"), c.rec.Body.Len(), c.rec.Body)
		}
	}
	if n := runs.of("grace"); n != 1 {
		t.Fatalf("grace ran %d times", n)
	}
}

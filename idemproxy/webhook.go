package idemproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem"
)

// reviewEvent is the review webhook's body: one key that went to review.
type reviewEvent struct {
	// ID is the key's id in the admin API and on the review page.
	ID        string    `json:"id"`
	Scope     string    `json:"scope"`
	Operation string    `json:"operation"`
	Key       string    `json:"key"`
	Reason    string    `json:"reason"`
	Method    string    `json:"method"`
	Path      string    `json:"path"`
	At        time.Time `json:"at"`
}

// keyAttrs name ev's key on a log line: a key in review, so the key itself
// (see idem.KeyDigest), with its digest.
func (ev reviewEvent) keyAttrs() slog.Attr {
	return slog.Group("", slog.String("operation", ev.Operation), slog.String("key", ev.Key),
		slog.String("key_digest", idem.KeyDigest(idem.Key{Scope: ev.Scope, Operation: ev.Operation, Key: ev.Key})))
}

// webhook POSTs a reviewEvent for every key that goes to review
// (--review-webhook). Events wait in a bounded queue that one worker
// drains, so the request path never waits for the target: when the queue
// is full, the event is dropped and counted. Each delivery is tried a few
// times with a doubling pause, each attempt with a timeout.
type webhook struct {
	url      string
	client   *http.Client
	queue    chan reviewEvent
	attempts int
	backoff  time.Duration
	timeout  time.Duration
	results  *prometheus.CounterVec
	log      *slog.Logger
	sleep    func(context.Context, time.Duration) error
}

// Webhook defaults.
const (
	webhookQueue    = 1000
	webhookAttempts = 5
	webhookBackoff  = time.Second
	webhookTimeout  = 10 * time.Second
)

func newWebhook(url string, results *prometheus.CounterVec, log *slog.Logger) *webhook {
	return &webhook{url: url, client: noRedirectClient, queue: make(chan reviewEvent, webhookQueue), attempts: webhookAttempts,
		backoff: webhookBackoff, timeout: webhookTimeout, results: results, log: log, sleep: sleepCtx}
}

// enqueue queues ev without waiting; it reports false when the queue was
// full and ev was dropped.
func (w *webhook) enqueue(ev reviewEvent) bool {
	select {
	case w.queue <- ev:
		return true
	default:
		w.results.WithLabelValues("dropped").Inc()
		w.log.Warn("review webhook queue full; event dropped", ev.keyAttrs(), slog.Int("queue", cap(w.queue)))
		return false
	}
}

// run delivers queued events until ctx ends.
func (w *webhook) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			if n := len(w.queue); n > 0 {
				w.log.Warn("review webhook stopped with events undelivered", slog.Int("count", n))
			}
			return
		case ev := <-w.queue:
			if err := w.deliver(ctx, ev); err != nil {
				w.results.WithLabelValues("failed").Inc()
				w.log.Warn("review webhook failed", ev.keyAttrs(), slog.Any("error", err))
			} else {
				w.results.WithLabelValues("delivered").Inc()
			}
		}
	}
}

// deliver POSTs ev, trying again after network errors and non-2xx answers.
func (w *webhook) deliver(ctx context.Context, ev reviewEvent) error {
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	pause := w.backoff
	for i := 1; ; i++ {
		err := w.post(ctx, body)
		if err == nil {
			return nil
		}
		if i >= w.attempts || ctx.Err() != nil {
			return fmt.Errorf("%s, attempt %d of %d: %w", redactURL(w.url), i, w.attempts, err)
		}
		if err := w.sleep(ctx, pause); err != nil {
			return err
		}
		pause *= 2
	}
}

func (w *webhook) post(ctx context.Context, body []byte) error {
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "idem-review-webhook")
	resp, err := w.client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("answered %s", resp.Status)
	}
	return nil
}

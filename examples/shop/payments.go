package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"time"

	"github.com/idem-dev/idem"
)

// payments is the shop's client of the payment provider. Every charge
// carries an Idempotency-Key that the provider honours: the same key never
// charges twice, and asking about a key tells what became of it.
type payments struct {
	base    string // the provider's URL
	hc      *http.Client
	timeout time.Duration // per call
	clk     clock
}

// charge is the provider's record of a charge.
type charge struct {
	ID          string `json:"id"`
	Key         string `json:"idempotency_key"`
	OrderID     int64  `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Status      string `json:"status"` // "succeeded" or "declined"
}

// chargeOutcome is what a charge attempt tells about the money.
type chargeOutcome int

const (
	charged     chargeOutcome = iota // the provider charged (charge set)
	declined                         // the provider declined the card: nothing charged
	rejected                         // the provider refused the request: nothing charged
	unavailable                      // the request was not sent, or the provider was unavailable: nothing charged, try again
	unknown                          // sent, and no clear answer (a timeout, a reset, a 500): maybe charged
)

// chargeKey is the provider's idempotency key for a payment: the user and
// the client's key, so that every retry of one payment asks for the same
// charge, and a resolver can ask about it from the idem record alone.
func chargeKey(k idem.Key) string { return k.Scope + ":" + k.Key }

// call runs one request to the provider, detached from the caller's
// cancellation (a client that hangs up must not abandon a charge midway)
// and bounded by p.timeout on p's clock. sent reports whether any of the
// request reached the wire.
func (p *payments) call(ctx context.Context, method, path, key string, body []byte) (status int, respBody []byte, sent bool, err error) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	stop := p.clk.AfterFunc(p.timeout, func() { cancel(fmt.Errorf("the payment provider did not answer within %v", p.timeout)) })
	defer stop()
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { sent = true }})
	req, err := http.NewRequestWithContext(ctx, method, p.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, false, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(idem.HeaderName, key)
	}
	resp, err := p.hc.Do(req)
	if err == nil {
		defer resp.Body.Close()
		respBody, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	}
	if err != nil {
		if cause := context.Cause(ctx); cause != nil {
			err = cause // our timeout, rather than "context canceled"
		}
		return 0, nil, sent, err
	}
	return resp.StatusCode, respBody, true, nil
}

// charge asks the provider to charge o's amount under key.
func (p *payments) charge(ctx context.Context, key string, o *order) (chargeOutcome, *charge, error) {
	body, _ := json.Marshal(map[string]any{"order_id": o.ID, "amount_cents": o.AmountCents, "currency": "EUR"})
	status, respBody, sent, err := p.call(ctx, http.MethodPost, "/v1/charges", key, body)
	switch {
	case err != nil && !sent:
		return unavailable, nil, err
	case err != nil:
		return unknown, nil, err
	case status == http.StatusServiceUnavailable:
		return unavailable, nil, fmt.Errorf("the payment provider is unavailable (503)")
	case status >= 500:
		return unknown, nil, fmt.Errorf("the payment provider failed with %d", status)
	case status >= 400 && status != http.StatusPaymentRequired:
		return rejected, nil, fmt.Errorf("the payment provider refused the charge: %d %s", status, bytes.TrimSpace(respBody))
	}
	var ch charge
	if err := json.Unmarshal(respBody, &ch); err != nil || ch.ID == "" {
		return unknown, nil, fmt.Errorf("the payment provider answered %d with an unreadable body", status)
	}
	switch {
	case status == http.StatusPaymentRequired && ch.Status == "declined":
		return declined, &ch, nil
	case status < 300 && ch.Status == "succeeded":
		return charged, &ch, nil
	}
	return unknown, nil, fmt.Errorf("the payment provider answered %d with status %q", status, ch.Status)
}

// lookup asks the provider what it has under key: found is false when it
// has no charge, which means none was ever made with that key.
func (p *payments) lookup(ctx context.Context, key string) (ch *charge, found bool, err error) {
	status, body, _, err := p.call(ctx, http.MethodGet, "/v1/charges/"+url.PathEscape(key), "", nil)
	switch {
	case err != nil:
		return nil, false, err
	case status == http.StatusNotFound:
		return nil, false, nil
	case status != http.StatusOK:
		return nil, false, fmt.Errorf("the payment provider answered %d to a lookup", status)
	}
	ch = new(charge)
	if err := json.Unmarshal(body, ch); err != nil || ch.Key != key {
		return nil, false, errors.New("the payment provider answered a lookup with an unreadable body")
	}
	return ch, true, nil
}

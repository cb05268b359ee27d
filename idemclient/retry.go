package idemclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem"
)

// verdict is what one attempt's result means.
type verdict struct {
	resp *http.Response
	err  error
	// body is what was read of resp's body to judge it (resp.Body is then
	// closed), or nil.
	body []byte
	// retry: another attempt with the same key may get a better answer.
	retry bool
	// refused: the answer becomes an *Error when it is the last.
	refused bool
}

// judge classifies the result of one attempt.
func judge(resp *http.Response, err error) verdict {
	if err != nil {
		return verdict{err: err, retry: retryableError(err)}
	}
	v := verdict{resp: resp}
	replayed := Replayed(resp) // a stored answer is final, whatever its status
	switch resp.StatusCode {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		v.body, v.refused = readBody(resp), true
	case http.StatusConflict:
		v.body, v.refused = readBody(resp), true
		v.retry = !replayed && inFlight(resp.Header, v.body)
	case http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
		v.retry = !replayed
	}
	return v
}

// final reports that no other attempt is to be made, whatever the budget.
func (v verdict) final(ctx context.Context) bool { return !v.retry || ctx.Err() != nil }

// serverWait is the wait the answer asked for with Retry-After.
func (v verdict) serverWait(now time.Time) (time.Duration, bool) {
	if v.resp == nil {
		return 0, false
	}
	return retryAfter(v.resp.Header, now)
}

// retryableError reports whether a network error may go away on another
// attempt. The context's end and a certificate that does not verify do not.
func retryableError(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &hostname), errors.As(err, &invalid):
		return false
	}
	return true
}

// inFlight reports whether a 409 says that a request with the key is still
// being processed. idem says so in its Idempotency-Outcome header and its
// problem type; idem's other 409s (needs review, not replayable) are not. A
// 409 from another server is, as the IETF draft has it.
func inFlight(h http.Header, body []byte) bool {
	if o := h.Get(headerOutcome); o != "" {
		return o == idem.SituationInFlight.Name
	}
	if p, ok := parseProblem(h, body); ok && strings.HasPrefix(p.Type, idem.ProblemTypeBase) {
		return p.Type == idem.ProblemInFlight
	}
	return true
}

// retryAfter parses a Retry-After header: delay-seconds or an HTTP-date
// (RFC 9110, section 10.2.3). A date in the past is no wait; a value too
// large to represent is the longest duration; anything else is ignored.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if strings.Trim(v, "0123456789") == "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n > math.MaxInt64/int64(time.Second) {
			return math.MaxInt64, true
		}
		return time.Duration(n) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(at.Sub(now), 0), true
	}
	return 0, false
}

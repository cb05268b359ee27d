package idem

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/idem-dev/idem/idemstore"
)

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := h.m
	opReq := r // the request the operation is named after
	class := methodProtected
	if !slices.Contains(m.cfg.Methods, r.Method) {
		var canonical string
		if class, canonical = m.classify(r.Method); class == methodUnprotected {
			h.next.ServeHTTP(w, r)
			return
		}
		if canonical != "" {
			c := *r
			c.Method = canonical
			opReq = &c
		}
	}
	op := m.cfg.Operation(opReq)
	pol := &m.policy
	if p, ok := m.routes[op]; ok {
		pol = p
	}
	if pol.Disabled {
		h.next.ServeHTTP(w, r)
		return
	}
	ev := Event{Request: r, Operation: op}
	if m.tracer != nil {
		var span trace.Span
		r, span = m.startRequestSpan(r, op)
		ev.Request = r
		defer endRequestSpan(span, &ev)
	}
	if m.cfg.OnOutcome != nil {
		start := time.Now()
		defer func() {
			ev.Duration = time.Since(start)
			m.cfg.OnOutcome(ev)
		}()
	}

	if class == methodMisspelt || class == methodInvalid {
		if pol.Observe {
			h.observed(w, r, &ev, FindingWouldRefuse)
			return
		}
		ev.Outcome, ev.Status = m.problem(w, SituationInvalidMethod.ProblemDoc(methodDetail(class, r.Method), ""))
		return
	}

	key, err := ParseKeyHeader(r.Header[HeaderName]) // HeaderName is canonical
	if err != nil {
		if errors.Is(err, ErrMissingKey) && pol.KeyOptional {
			ev.Outcome = SituationNoKey.Name
			ev.Status = passThrough(h.next, w, r)
			return
		}
		var ke *KeyError
		errors.As(err, &ke)
		if pol.Observe {
			finding := FindingInvalidKey
			if errors.Is(err, ErrMissingKey) {
				finding = FindingMissingKey
			}
			h.observed(w, r, &ev, finding)
			return
		}
		if errors.Is(err, ErrMissingKey) {
			ev.Outcome, ev.Status = m.problem(w, SituationMissingKey.ProblemDoc("This operation requires an Idempotency-Key header; send a unique value (such as a UUID) and reuse it when you retry.", ""))
			return
		}
		ev.Outcome, ev.Status = m.problem(w, SituationInvalidKey.ProblemDoc(ke.Reason, ""))
		return
	}
	ev.Key = key

	scope, err := m.cfg.Scope(r)
	if err == nil {
		err = checkScope(scope) // an empty scope is a missing one
	}
	if err != nil && pol.Observe {
		h.observed(w, r, &ev, FindingWouldRefuse)
		return
	}
	if errors.Is(err, ErrScopeMissing) {
		ev.Outcome, ev.Status = m.problem(w, SituationScopeMissing.ProblemDoc("The request carries no credentials, so its key cannot be told from another client's.", ""))
		return
	}
	if err != nil {
		p := SituationScopeDenied.ProblemDoc("The request's credentials do not identify a client.", "")
		var se *ScopeError
		if errors.As(err, &se) {
			if se.Status != 0 {
				p.Status = se.Status
			}
			if se.Detail != "" {
				p.Detail = se.Detail
			}
			p.Title = http.StatusText(p.Status)
		}
		ev.Outcome, ev.Status = m.problem(w, p)
		return
	}
	ev.Scope = scope

	// Read the body for the fingerprint; the handler reads it again.
	st := getState()
	defer putState(st)
	if r.ContentLength > pol.MaxRequestBody {
		if pol.Observe {
			h.observed(w, r, &ev, FindingWouldRefuse)
			return
		}
		closeUnread(w, r)
		ev.Outcome, ev.Status = m.problem(w, tooLarge(pol.MaxRequestBody, key))
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		over, held, err := readLimited(&st.reqBuf, r.Body, r.ContentLength, pol.MaxRequestBody, m.cfg.BodyBudget)
		if held > 0 {
			defer m.cfg.BodyBudget.Release(held)
		}
		if err == errNoRoom {
			// Refused in observe mode too: the budget bounds memory.
			closeUnread(w, r)
			w.Header().Set("Retry-After", "1")
			ev.Outcome, ev.Status = m.problem(w, SituationBusy.ProblemDoc("The server holds as many request bodies as it may; this one was not read. Retry with the same key.", key))
			return
		}
		if err != nil && pol.Observe {
			// Forward what was read, then the same error, as the client sent it.
			r.Body = &readCloser{io.MultiReader(bytes.NewReader(st.reqBuf.Bytes()), errReader{err}), r.Body}
			h.observed(w, r, &ev, FindingWouldRefuse)
			return
		}
		if err != nil {
			ev.Outcome, ev.Status = m.problem(w, SituationBodyUnreadable.ProblemDoc("The request body could not be read: "+err.Error(), key))
			return
		}
		if over && pol.Observe {
			// Forward what was read, then the rest.
			r.Body = &readCloser{io.MultiReader(bytes.NewReader(st.reqBuf.Bytes()), r.Body), r.Body}
			h.observed(w, r, &ev, FindingWouldRefuse)
			return
		}
		if over {
			closeUnread(w, r)
			ev.Outcome, ev.Status = m.problem(w, tooLarge(pol.MaxRequestBody, key))
			return
		}
		st.body.Reset(st.reqBuf.Bytes())
		r.Body = &st.body
	}
	buf := &st.reqBuf
	st.fp = FingerprintSource{Input: FingerprintInput{
		Method: r.Method, Operation: op, Path: r.URL.EscapedPath(), Query: r.URL.RawQuery,
		ContentType:     singletonHeader(r.Header["Content-Type"]),
		ContentEncoding: joinedHeader(r.Header["Content-Encoding"]),
		Body:            buf.Bytes(),
	}, Options: FingerprintOptions{ExcludeFields: pol.ExcludeFields, IncludeFields: pol.IncludeFields, Key: m.cfg.FingerprintKey}}
	fp, err := Fingerprint(st.fp.Input, st.fp.Options)
	if err != nil { // validated at construction; kept for safety
		panic(err)
	}

	var label string
	if m.cfg.ScopeLabel != nil {
		label = m.cfg.ScopeLabel(r)
	}
	wait := pol.Wait
	if pol.Observe {
		wait = 0 // a duplicate in flight is forwarded at once
	}
	res, err := m.e.Begin(r.Context(), Request{
		Key: Key{Scope: scope, Operation: op, Key: key}, Fingerprint: fp, FingerprintSource: &st.fp,
		Kind: pol.Kind, Wait: wait, Lease: pol.Lease, Retention: pol.Retention,
		Info: st.requestInfo(r, pol, buf.Bytes()), ScopeLabel: label, replays: replayGate(r, pol),
	})
	if err != nil {
		if errors.Is(err, errReplayBusy) {
			ev.Outcome, ev.Status = m.replayBusy(w, key)
			return
		}
		if r.Context().Err() != nil {
			ev.Outcome, ev.Status = SituationCanceled.Name, SituationCanceled.Status
			return // the client is gone; nobody to answer
		}
		if pol.Observe {
			if errors.Is(err, ErrTooLong) || errors.Is(err, ErrSealed) {
				h.observed(w, r, &ev, FindingWouldRefuse)
				return
			}
			m.e.logStoreDown(r.Context(), err, "observe mode forwards requests unchecked until it answers",
				slog.String("operation", op))
			ev.Outcome = SituationFailOpen.Name
			ev.Status = passThrough(h.next, w, r)
			return
		}
		if errors.Is(err, ErrTooLong) {
			// A long operation comes from a long path (414); a long scope
			// from whatever Config.Scope reads off the request.
			p := SituationTooLong.ProblemDoc(fmt.Sprintf("The request path is longer than the %d bytes idem keeps for an operation.", MaxOperationLength), key)
			if len(op) <= MaxOperationLength {
				p.Title, p.Status = "Scope too long", http.StatusBadRequest
				p.Detail = fmt.Sprintf("The request's scope is longer than the %d bytes idem keeps.", MaxScopeLength)
			}
			ev.Outcome, ev.Status = m.problem(w, p)
			return
		}
		if errors.Is(err, ErrSealed) {
			// The key was used, and its answer is stored but does not open
			// (logged by the engine): it must neither be replayed nor run
			// again, so never fail open either.
			ev.Outcome, ev.Status = m.problem(w, SituationSealed.ProblemDoc("A request with this Idempotency-Key was already processed, but its stored answer cannot be read. It will not run again; retry later with the same key.", key))
			return
		}
		// A key found completed whose answer could not be read is never
		// failed open: running it again would be a certain duplicate.
		failOpen := m.cfg.FailOpen && !errors.Is(err, errAnswerUnread)
		what := "requests get 503 and are not run until it answers"
		if failOpen {
			what = "requests run unprotected (Config.FailOpen) until it answers"
		}
		m.e.logStoreDown(r.Context(), err, what, slog.String("operation", op), slog.Bool("fail_open", failOpen))
		if failOpen {
			ev.Outcome = SituationFailOpen.Name
			ev.Status = passThrough(h.next, w, r)
			return
		}
		w.Header().Set("Retry-After", "1")
		ev.Outcome, ev.Status = m.problem(w, SituationUnavailable.ProblemDoc("The request was not processed because its idempotency key could not be checked; retry with the same key.", key))
		return
	}
	ev.Outcome = res.Outcome.String()
	defer res.releaseReplay()
	if pol.Observe && res.Outcome != Acquired {
		// Forwarded as if idem were not there; the record is left as it is.
		h.observed(w, r, &ev, findingOf[res.Outcome])
		return
	}
	switch res.Outcome {
	case Acquired:
		h.run(w, r, res.Lease, pol, st, &ev)
	case Replayed:
		ev.Outcome, ev.Status = m.replay(w, r, res.Response, key, res.held)
	case Mismatch:
		ev.Outcome, ev.Status = m.problem(w, SituationMismatch.ProblemDoc(mismatchDetail(r, buf.Len()), key))
	case InFlight:
		w.Header().Set("Retry-After", strconv.Itoa(int(res.RetryAfter/time.Second)))
		ev.Outcome, ev.Status = m.problem(w, SituationInFlight.ProblemDoc("A request with this Idempotency-Key is still being processed. Retry after the time in Retry-After to get its answer.", key))
	case NeedsReview:
		ev.Outcome, ev.Status = m.problem(w, SituationNeedsReview.ProblemDoc("An earlier request with this Idempotency-Key ended with an unknown outcome and is being reviewed. It will not run again; retry later to get its answer.", key))
	}
}

// mismatchDetail explains a 422. A body sent without a JSON Content-Type
// (curl -d sends application/x-www-form-urlencoded) is compared byte for
// byte, so a retry that only reorders its members is a different request:
// the detail says so.
func mismatchDetail(r *http.Request, bodyLen int) string {
	const detail = "This Idempotency-Key was already used with a different request. Use a new key for a new request."
	if bodyLen > 0 && comparedAsSent(singletonHeader(r.Header["Content-Type"]), joinedHeader(r.Header["Content-Encoding"])) {
		return detail + " The body was compared byte for byte, because its Content-Type is not JSON (application/json or +json, in UTF-8, with no Content-Encoding): send JSON with a JSON Content-Type for member order and whitespace not to matter."
	}
	return detail
}

func firstValue(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

func tooLarge(limit int64, key string) Problem {
	return SituationBodyTooLarge.ProblemDoc("The request body is over the "+strconv.FormatInt(limit, 10)+"-byte limit for idempotent requests.", key)
}

// problem writes p, with the Idempotency-Outcome header of its situation,
// and returns that outcome and the status.
func (m *middleware) problem(w http.ResponseWriter, p Problem) (string, int) {
	outcome := situationOf[p.Type]
	p.Type = RebaseProblemType(p.Type, m.cfg.ProblemBaseURL)
	w.Header().Set(outcomeHeader, outcome)
	WriteProblem(w, p)
	return outcome, p.Status
}

// situationOf maps problem types to their situation's name.
var situationOf = func() map[string]string {
	m := make(map[string]string)
	for _, s := range Situations() {
		if s.Problem != "" {
			m[s.Problem] = s.Name
		}
	}
	return m
}()

// requestInfo is what the record keeps of r for operators: method, path and
// query, and the body where the policy allows it and it fits. It lives in
// the pooled state: stores copy what they keep before Reserve returns.
func (st *reqState) requestInfo(r *http.Request, pol *Policy, body []byte) *idemstore.Request {
	st.info = idemstore.Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery}
	if pol.StoreRequestBody && len(body) <= MaxStoredRequestBody {
		st.info.Body = body
	}
	return &st.info
}

// closeUnread makes the answer to an HTTP/1 request whose body is left
// unread close the connection after it. Otherwise net/http's server first
// reads what is left of the body (up to 256 KiB) to keep the connection,
// so that a client that stalls mid-body gets its answer only at the read
// timeout. HTTP/2 ends the stream alone.
func closeUnread(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
}

// passThrough runs next unprotected and returns the status it answered, for
// Event.Status. The writer it gives next records the status and otherwise
// defers to w: Unwrap serves http.ResponseController, and Flush and Hijack
// are passed on.
func passThrough(next http.Handler, w http.ResponseWriter, r *http.Request) int {
	sw := &statusWriter{ResponseWriter: w}
	next.ServeHTTP(sw, r)
	if sw.status == 0 && sw.wrote {
		return http.StatusOK
	}
	return sw.status
}

// statusWriter records the status a handler answers.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 && (code < 100 || code > 199 || code == http.StatusSwitchingProtocols) {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	s.wrote = true
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusWriter) Flush() {
	s.wrote = true
	_ = http.NewResponseController(s.ResponseWriter).Flush()
}

func (s *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(s.ResponseWriter).Hijack()
}

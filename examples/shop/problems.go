package main

import (
	"net/http"
	"strconv"

	"github.com/idem-dev/idem"
)

// problemBase prefixes the shop's own problem types (RFC 9457); the README
// lists them. idem's own (a key in flight, in review, reused) have theirs.
const problemBase = "https://github.com/idem-dev/idem/blob/main/examples/shop/README.md#"

// shopProblem is one kind of refusal the shop answers with.
type shopProblem struct {
	name   string
	status int
	title  string
}

// The shop's problems.
var (
	probBadRequest      = shopProblem{"bad-request", http.StatusBadRequest, "Bad request"}
	probMediaType       = shopProblem{"unsupported-media-type", http.StatusUnsupportedMediaType, "JSON expected"}
	probNoOrder         = shopProblem{"order-not-found", http.StatusNotFound, "No such order"}
	probUnknownProduct  = shopProblem{"unknown-product", http.StatusUnprocessableEntity, "No such product"}
	probOutOfStock      = shopProblem{"out-of-stock", http.StatusConflict, "Out of stock"}
	probOrderIDReused   = shopProblem{"client-order-id-reused", http.StatusConflict, "Client order ID already used"}
	probRefused         = shopProblem{"transition-refused", http.StatusConflict, "Order state does not allow this"}
	probPaymentBusy     = shopProblem{"payment-in-progress", http.StatusConflict, "Another payment of this order is in progress"}
	probDeclined        = shopProblem{"payment-declined", http.StatusPaymentRequired, "Payment declined"}
	probPaymentRejected = shopProblem{"payment-rejected", http.StatusBadGateway, "Payment refused by the provider"}
	probPaymentUnknown  = shopProblem{"payment-outcome-unknown", http.StatusBadGateway, "Payment outcome unknown"}
	probTryAgain        = shopProblem{"try-again", http.StatusServiceUnavailable, "Nothing was done; try again"}
)

// doc returns the problem document of p with detail.
func (p shopProblem) doc(detail string) idem.Problem {
	return idem.Problem{Type: problemBase + p.name, Title: p.title, Status: p.status, Detail: detail}
}

// write answers p with detail. A 503 says when to come back.
func (p shopProblem) write(w http.ResponseWriter, detail string) {
	if p.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", strconv.Itoa(1))
	}
	idem.WriteProblem(w, p.doc(detail))
}

package idem

// Mark is what Retryable or Ambiguous said about an error, for front doors
// that settle a key by the error their handler returned (the gRPC and
// Connect interceptors), as Do does.
type Mark int

// The marks FailureMark reports.
const (
	// Unmarked: the error says nothing about what happened; the front
	// door's own rules apply (a gRPC status is stored as the answer).
	Unmarked Mark = iota
	// MarkedRetryable: every branch of the error is marked Retryable: the
	// failure had no effect, and the key is released.
	MarkedRetryable
	// MarkedAmbiguous: a branch of the error is marked Ambiguous: its
	// effect is unknown, and the key goes to needs_review.
	MarkedAmbiguous
)

// String returns "unmarked", "retryable" or "ambiguous".
func (m Mark) String() string {
	switch m {
	case MarkedRetryable:
		return "retryable"
	case MarkedAmbiguous:
		return "ambiguous"
	}
	return "unmarked"
}

// FailureMark reports how err was marked, by the rules Do settles a key
// by: MarkedAmbiguous if Ambiguous marked it anywhere in its tree
// (errors.Join included), MarkedRetryable if every branch ends in a
// Retryable mark, and Unmarked otherwise (nil included).
func FailureMark(err error) Mark {
	ambiguous, retryable := failureMarks(err)
	switch {
	case ambiguous != nil:
		return MarkedAmbiguous
	case retryable:
		return MarkedRetryable
	}
	return Unmarked
}

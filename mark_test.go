package idem_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/idem-dev/idem"
)

func TestFailureMark(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, tc := range []struct {
		err  error
		want idem.Mark
	}{
		{nil, idem.Unmarked},
		{boom, idem.Unmarked},
		{idem.Retryable(boom), idem.MarkedRetryable},
		{fmt.Errorf("charge: %w", idem.Retryable(boom)), idem.MarkedRetryable},
		{idem.Ambiguous(boom), idem.MarkedAmbiguous},
		{idem.Retryable(idem.Ambiguous(boom)), idem.MarkedAmbiguous},
		{errors.Join(idem.Retryable(boom), idem.Retryable(boom)), idem.MarkedRetryable},
		{errors.Join(idem.Retryable(boom), boom), idem.Unmarked}, // one branch may have acted
		{errors.Join(idem.Retryable(boom), idem.Ambiguous(boom)), idem.MarkedAmbiguous},
	} {
		if got := idem.FailureMark(tc.err); got != tc.want {
			t.Errorf("FailureMark(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

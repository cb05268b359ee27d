package idem_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idem-dev/idem"
)

// TestDefaultOperationReadsPathsAsServers: without a route pattern, the
// operation's path is the escaped path normalised as servers read it, so
// that the spellings of one path are one operation ("/%70ay", "//pay" and
// "/x/../pay" are "/pay"), while %2F stays apart from '/'.
func TestDefaultOperationReadsPathsAsServers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ target, want string }{
		{"/pay", "POST /pay"},
		{"/%70ay", "POST /pay"},
		{"/p%61y", "POST /pay"},
		{"//pay", "POST /pay"},
		{"/x/../pay", "POST /pay"},
		{"/./pay", "POST /pay"},
		{"/acct/a%2fb", "POST /acct/a%2Fb"},
		{"/acct/a/b", "POST /acct/a/b"},
	} {
		r := httptest.NewRequest(http.MethodPost, tc.target, nil)
		if got := idem.DefaultOperation(r); got != tc.want {
			t.Errorf("DefaultOperation(POST %s) = %q, want %q", tc.target, got, tc.want)
		}
	}
}

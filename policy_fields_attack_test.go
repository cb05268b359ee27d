package idem_test

import (
	"testing"

	"github.com/idem-dev/idem"
)

// TestIncludeAndExcludeFieldsTogether: with both, only the included
// members count, minus the excluded ones under them; arrays are reached by
// index; a malformed pointer is an error, not a silent whole-body digest.
func TestIncludeAndExcludeFieldsTogether(t *testing.T) {
	t.Parallel()
	opts := idem.FingerprintOptions{IncludeFields: []string{"/order", "/items/0/sku"}, ExcludeFields: []string{"/order/trace"}}
	fp := func(body string) string {
		t.Helper()
		s, err := idem.Fingerprint(idem.FingerprintInput{Method: "POST", Operation: "POST /o", Path: "/o", ContentType: "application/json", Body: []byte(body)}, opts)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	base := fp(`{"order":{"amount":1,"trace":"a"},"items":[{"sku":"x","n":1}],"note":"a"}`)
	for _, same := range []string{
		`{"order":{"amount":1,"trace":"b"},"items":[{"sku":"x","n":1}],"note":"a"}`,
		`{"order":{"amount":1,"trace":"a"},"items":[{"sku":"x","n":2}],"note":"b"}`,
		`{"note":"z","items":[{"n":9,"sku":"x"}],"order":{"trace":"q","amount":1}}`,
	} {
		if fp(same) != base {
			t.Errorf("%s: different fingerprint, want the same", same)
		}
	}
	for _, diff := range []string{
		`{"order":{"amount":2,"trace":"a"},"items":[{"sku":"x","n":1}],"note":"a"}`,
		`{"order":{"amount":1,"trace":"a"},"items":[{"sku":"y","n":1}],"note":"a"}`,
		`{"order":{"amount":1,"trace":"a","extra":1},"items":[{"sku":"x","n":1}],"note":"a"}`,
		`{"items":[{"sku":"x","n":1}],"note":"a"}`,
	} {
		if fp(diff) == base {
			t.Errorf("%s: same fingerprint, want a different one", diff)
		}
	}
	for _, bad := range []string{"order", "", "#/order"} {
		for _, o := range []idem.FingerprintOptions{{IncludeFields: []string{bad}}, {ExcludeFields: []string{bad}}} {
			if _, err := idem.Fingerprint(idem.FingerprintInput{Method: "POST", ContentType: "application/json", Body: []byte(`{}`)}, o); err == nil {
				t.Errorf("pointer %q accepted", bad)
			}
		}
	}
}

package idem

import (
	"net/http"
	"strings"
	"testing"
)

// Every unstored header is dropped whatever the case it was set in, and a
// header of the same length that is not one of them is kept.
func TestStorableHeaderDropsUnstoredInAnyCase(t *testing.T) {
	for _, name := range unstoredNames {
		for _, spelt := range []string{name, strings.ToLower(name), strings.ToUpper(name)} {
			kept := "X" + strings.Repeat("k", len(name)-1)
			h := http.Header{spelt: {"v"}, kept: {"w"}, "Content-Type": {"application/json"}}
			got := storableHeader(h)
			if _, ok := got[spelt]; ok {
				t.Errorf("%s was stored", spelt)
			}
			if got[kept] == nil || got["Content-Type"] == nil {
				t.Errorf("%s set beside %s, and Content-Type: stored %v", kept, spelt, got)
			}
		}
	}
}

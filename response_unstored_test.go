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

// Every spelling of every unstored header, each letter in either case, is
// dropped, set alone or beside other headers, and no kept header of the
// same length is lost with it.
func TestStorableHeaderDropsEveryCaseVariant(t *testing.T) {
	n := 0
	for _, name := range unstoredNames {
		var letters []int
		for i := 0; i < len(name); i++ {
			if c := name[i]; 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' {
				letters = append(letters, i)
			}
		}
		kept := "X" + strings.Repeat("k", len(name)-1)
		b := []byte(name)
		for mask := 0; mask < 1<<len(letters); mask++ {
			for bit, i := range letters {
				if mask&(1<<bit) != 0 {
					b[i] = strings.ToUpper(name[i : i+1])[0]
				} else {
					b[i] = strings.ToLower(name[i : i+1])[0]
				}
			}
			spelt := string(b)
			if got := storableHeader(http.Header{spelt: {"v"}}); got[spelt] != nil {
				t.Fatalf("%s alone was stored", spelt)
			}
			got := storableHeader(http.Header{spelt: {"v"}, kept: {"w"}})
			if got[spelt] != nil || got[kept] == nil {
				t.Fatalf("%s beside %s: stored %v", spelt, kept, got)
			}
			n++
		}
	}
	if n < 1<<18 {
		t.Fatalf("tried %d spellings; Proxy-Authorization alone has %d", n, 1<<18)
	}
}

// A trailer set under http.TrailerPrefix is sent as the field it names: a
// Set-Cookie, credential or hop-by-hop trailer, or one Connection names, is
// not stored either, and other trailers are.
func TestStorableHeaderDropsUnstoredTrailers(t *testing.T) {
	h := http.Header{
		"Trailer:Set-Cookie":        {"session=secret"},
		"Trailer:set-cookie":        {"other=secret"},
		"Trailer:Authorization":     {"Bearer secret"},
		"Trailer:Transfer-Encoding": {"chunked"},
		"Connection":                {"X-Hop"},
		"Trailer:X-Hop":             {"one connection only"},
		"Trailer:X-Checksum":        {"abc"},
		"Content-Type":              {"application/json"},
	}
	got := storableHeader(h)
	for name := range got {
		switch name {
		case "Trailer:X-Checksum", "Content-Type":
		default:
			t.Errorf("stored %s: %q", name, got[name])
		}
	}
	if got["Trailer:X-Checksum"] == nil || got["Content-Type"] == nil {
		t.Errorf("kept headers dropped: %v", got)
	}
	for _, name := range []string{"Trailer:Set-Cookie", "Trailer:Authorization"} {
		if got := storableHeader(http.Header{name: {"secret"}}); got[name] != nil {
			t.Errorf("%s alone was stored", name)
		}
	}
}

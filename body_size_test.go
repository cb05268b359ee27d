package idem_test

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
)

// TestBodyBufferSizedFromContentLength: a body that announces its length
// is read into a buffer of that size, allocated once, not one grown by
// doubling (which, for 1 MiB − 1 bytes, ended at 2 MiB and left 2 MiB of
// smaller copies behind). A body without a length still grows, and every
// body is still bounded by the limit.
func TestBodyBufferSizedFromContentLength(t *testing.T) {
	t.Parallel()
	const size = 1<<20 - 1
	body := strings.Repeat("x", size)
	var buf bytes.Buffer
	over, err := idem.ReadLimited(&buf, io.LimitReader(strings.NewReader(body), size), size, 1<<20)
	if err != nil || over || buf.Len() != size {
		t.Fatalf("read %d bytes, over %v, %v", buf.Len(), over, err)
	}
	if c := buf.Cap(); c > size+64<<10 {
		t.Fatalf("a %d-byte body with its Content-Length took a %d-byte buffer", size, c)
	}
	for _, tc := range []struct {
		name        string
		body        string
		size, limit int64
		over        bool
	}{
		{"no length", body, -1, 1 << 20, false},
		{"no length, over", body + "xx", -1, 1 << 20, true},
		{"a length over the limit", body, size, 100, true},
		{"a length that lies short", body, 10, 1 << 20, false},
	} {
		var b bytes.Buffer
		over, err := idem.ReadLimited(&b, strings.NewReader(tc.body), tc.size, tc.limit)
		if err != nil || over != tc.over || (!over && b.String() != tc.body) {
			t.Errorf("%s: read %d bytes, over %v, %v; want over %v", tc.name, b.Len(), over, err, tc.over)
		}
	}
}

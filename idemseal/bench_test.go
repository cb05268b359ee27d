package idemseal_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

// BenchmarkResponse seals and opens answers of a few sizes.
func BenchmarkResponse(b *testing.B) {
	k := ring(b, key1)
	for _, size := range []int{30, 1 << 10, 64 << 10} {
		resp := &idemstore.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: make([]byte, size)}
		sealed, err := k.SealResponse(recKey, resp)
		if err != nil {
			b.Fatal(err)
		}
		b.Run("seal/"+strconv.Itoa(size), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				if _, err := k.SealResponse(recKey, resp); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("open/"+strconv.Itoa(size), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				if _, err := k.OpenResponse(recKey, sealed); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package capacity

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// clients is how many distinct scopes (API credentials) the records are
// spread over.
const clients = 1000

// operation is every record's operation, as idem serve names a route.
const operation = "POST /v1/payments"

// scope returns the scope of client i as idem serve derives it: the hex
// HMAC-SHA256 of the client's credential under the scope secret.
func scope(i int) string {
	m := hmac.New(sha256.New, []byte("capacity-guide-scope-secret-0123"))
	fmt.Fprintf(m, "Bearer sk_live_%024d", i%clients)
	return hex.EncodeToString(m.Sum(nil))
}

// requestBody returns a JSON payment request of about 200 bytes.
func requestBody(r *rand.Rand) []byte {
	return fmt.Appendf(nil, `{"amount":%d,"currency":"usd","customer":"cus_%s","description":"Order %d","metadata":{"order_id":"%s","channel":"web"},"capture":true}`,
		100+r.IntN(100000), strings.ReplaceAll(uuid.NewString(), "-", "")[:24], r.IntN(1e7), uuid.NewString())
}

// answer returns a JSON answer of exactly size bytes (at least 200): a
// list of line items with ids, amounts and descriptions, as compressible as
// a real API's JSON (TOAST in PostgreSQL compresses large values), padded
// to size by a last string member.
func answer(r *rand.Rand, size int) []byte {
	const tail = `],"note":""}`
	b := fmt.Appendf(nil, `{"id":"pay_%s","object":"payment","status":"succeeded","items":[`, uuid.NewString())
	for i := 0; ; i++ {
		item := fmt.Sprintf(`{"id":"li_%s","amount":%d,"quantity":%d,"description":"Item %d of order %d"}`,
			uuid.NewString()[:18], r.IntN(100000), 1+r.IntN(9), i, r.IntN(1e7))
		if i > 0 {
			item = "," + item
		}
		if len(b)+len(item)+len(tail) > size {
			break
		}
		b = append(b, item...)
	}
	b = append(b, tail[:len(tail)-2]...)
	b = append(b, strings.Repeat("x", size-len(b)-2)...)
	return append(b, '"', '}')
}

// shape says what each loaded record carries.
type shape struct {
	// answerSize is the answer body's length in bytes.
	answerSize int
	// storeBody keeps the request body on the record, as
	// idem.Policy.StoreRequestBody does.
	storeBody bool
	// retention is the completed record's retention; zero or less makes it
	// purgeable at once.
	retention time.Duration
}

// load stores n completed records of shape sh in s, each by a Reserve and
// a Complete, from workers goroutines.
func load(ctx context.Context, s idemstore.Store, n, workers int, sh shape) error {
	var (
		next   atomic.Int64
		mu     sync.Mutex
		first  error
		wg     sync.WaitGroup
		seed   = uint64(time.Now().UnixNano())
		header = http.Header{"Content-Type": {"application/json"}}
	)
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := pair(ctx, s, r, i, sh, header); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// pair stores one record: the fingerprint, request and answer a proxy
// would give the store for a fresh key.
func pair(ctx context.Context, s idemstore.Store, r *rand.Rand, i int, sh shape, header http.Header) error {
	body := requestBody(r)
	fp, err := idem.Fingerprint(idem.FingerprintInput{Method: "POST", Operation: operation, Path: "/v1/payments",
		ContentType: "application/json", Body: body}, idem.FingerprintOptions{})
	if err != nil {
		return err
	}
	req := &idemstore.Request{Method: "POST", Path: "/v1/payments"}
	if sh.storeBody {
		req.Body = body
	}
	k := idemstore.Key{Scope: scope(r.IntN(clients)), Operation: operation, Key: uuid.NewString()}
	tok := hex.EncodeToString(fmt.Appendf(nil, "%08x%08x", r.Uint32(), i))
	_, created, err := s.Reserve(ctx, idemstore.ReserveParams{Key: k, Fingerprint: fp, Token: tok, Lease: time.Minute, Request: req})
	if err != nil {
		return err
	}
	if !created {
		return fmt.Errorf("capacity: fresh key %q was not created", k.Key)
	}
	h := header.Clone()
	h.Set("X-Request-Id", uuid.NewString())
	return s.Complete(ctx, idemstore.CompleteParams{Key: k, Token: tok, Retention: sh.retention,
		Response: &idemstore.Response{Status: http.StatusCreated, Header: h, Body: answer(r, sh.answerSize)}})
}

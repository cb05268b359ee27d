package idem_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

// HeaderScopeLabel labels each key with the account ID a gateway set
// after it authenticated the caller, so that an operator can tell whose
// key it is and find it, while the scope stays a credential's digest. A
// retry with another label is the same key. The label of a credential
// header is refused.
func ExampleHeaderScopeLabel() {
	store := idemmem.MustNew(idemmem.Config{})
	defer store.Close()
	engine, err := idem.NewEngine(store, idem.EngineConfig{})
	if err != nil {
		log.Fatal(err)
	}
	scope := func(r *http.Request) (string, error) {
		if r.Header.Get("Authorization") == "" {
			return "", idem.ErrScopeMissing
		}
		return "credential-digest", nil // a keyed digest of the credential, in practice
	}
	protect, err := idem.NewMiddleware(engine, idem.Config{Scope: scope, ScopeLabel: idem.HeaderScopeLabel("X-Account-Id")})
	if err != nil {
		log.Fatal(err)
	}
	h := protect(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	for _, account := range []string{"acct_8842", "acct_spoofed"} {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100}`))
		r.Header.Set("Authorization", "Bearer sk_live_4f9a")
		r.Header.Set("Idempotency-Key", "order-1001")
		r.Header.Set("X-Account-Id", account)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(account, w.Code, w.Header().Get("Idempotency-Outcome"))
	}

	// What an operator searches for (label= in the admin API).
	page, err := store.List(context.Background(), idemstore.ListParams{ScopeLabels: []string{"acct_8842"}})
	if err != nil {
		log.Fatal(err)
	}
	for _, rec := range page.Records {
		fmt.Printf("%s %s: %s\n", rec.Key.Key, rec.State, rec.ScopeLabel)
	}

	_, err = idem.NewMiddleware(engine, idem.Config{Scope: scope, ScopeLabel: idem.HeaderScopeLabel("Authorization")})
	fmt.Println("Authorization refused:", err != nil)
	// Output:
	// acct_8842 201 acquired
	// acct_spoofed 201 replayed
	// order-1001 completed: acct_8842
	// Authorization refused: true
}

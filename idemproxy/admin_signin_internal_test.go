package idemproxy

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemmem"
)

// TestAdminSignInBehindBalancer: with admin_trusted_proxies naming the
// load balancer, one client's wrong tokens lock out that client only;
// without it every sign-in through the balancer shares the balancer's
// count, and one client locks every operator out.
func TestAdminSignInBehindBalancer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		trusted    []string
		wantOther  int // what another client with the right token gets
		wantSender int // what the client with the wrong tokens gets
	}{
		{nil, http.StatusTooManyRequests, http.StatusTooManyRequests},
		{[]string{"127.0.0.1"}, http.StatusOK, http.StatusTooManyRequests},
		{[]string{"127.0.0.0/8"}, http.StatusOK, http.StatusTooManyRequests},
	} {
		t.Run(strings.Join(tc.trusted, ","), func(t *testing.T) {
			t.Parallel()
			mem := idemmem.MustNew(idemmem.Config{})
			defer mem.Close()
			cfg := Config{Upstream: "http://127.0.0.1:1", Admin: "127.0.0.1:0", AdminTrustedProxies: tc.trusted}.WithDefaults()
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			h, err := newReview(cfg, mem, NewMetrics(), slog.New(slog.DiscardHandler)).adminHandler(cfg, map[string]string{"ops": "right-token-0123456789"})
			if err != nil {
				t.Fatal(err)
			}
			signIn := func(client, token string) int {
				r := httptest.NewRequest("GET", "/api/v1/keys", nil)
				r.RemoteAddr = "127.0.0.1:40000" // the balancer
				r.Header.Set("X-Forwarded-For", client)
				r.Header.Set("Authorization", "Bearer "+token)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w.Code
			}
			for range 20 {
				signIn("203.0.113.1", "wrong")
			}
			if got := signIn("203.0.113.1", "right-token-0123456789"); got != tc.wantSender {
				t.Errorf("the client that failed 20 times: %d, want %d", got, tc.wantSender)
			}
			if got := signIn("203.0.113.2", "right-token-0123456789"); got != tc.wantOther {
				t.Errorf("another client with the right token: %d, want %d", got, tc.wantOther)
			}
		})
	}
}

func TestAdminSignInSettingsChecked(t *testing.T) {
	t.Parallel()
	for yaml, want := range map[string]string{
		"admin_trusted_proxies: [lb.internal]": `"lb.internal" is neither an address nor a CIDR prefix`,
		"admin_trusted_proxies: [10.0.0.0/33]": `"10.0.0.0/33" is neither an address nor a CIDR prefix`,
		"admin_sign_in_ipv6_prefix: 16":        "admin_sign_in_ipv6_prefix (--admin-sign-in-ipv6-prefix) must be between 32 and 128, got 16",
		"admin_sign_in_ipv6_prefix: 129":       "must be between 32 and 128, got 129",
	} {
		cfg, err := ParseConfig([]byte("upstream: http://127.0.0.1:1\nadmin: 127.0.0.1:0\n" + yaml + "\n"))
		if err == nil {
			err = cfg.WithDefaults().Validate()
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", yaml, err, want)
		}
	}
	cfg, err := ParseConfig([]byte("upstream: http://127.0.0.1:1\nadmin: 127.0.0.1:0\nadmin_trusted_proxies: [10.0.0.7, '10.1.0.0/16', '::ffff:10.2.0.1']\nadmin_sign_in_ipv6_prefix: 56\n"))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := cfg.adminTrustedProxies()
	if len(got) != 3 || got[0].String() != "10.0.0.7/32" || got[1].String() != "10.1.0.0/16" || got[2].String() != "10.2.0.1/32" {
		t.Errorf("parsed %v", got)
	}
}

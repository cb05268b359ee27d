// Package browsertest starts a real headless Chromium (Debian's chromium
// package, driven by chromedp) for tests of the pages idem serves: the
// review page, the example shop's checkout. scripts/services.sh installs
// chromium; without it a test skips, or fails when CI=true.
package browsertest

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// ChromiumPath returns the path of Debian's chromium (or of
// $IDEM_TEST_CHROMIUM). Without one the test skips, or fails when CI=true.
func ChromiumPath(tb testing.TB) string {
	tb.Helper()
	for _, p := range []string{os.Getenv("IDEM_TEST_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p == "" {
			continue
		}
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	if os.Getenv("CI") == "true" {
		tb.Fatal("chromium is not installed and CI=true; run scripts/services.sh (it installs Debian's chromium)")
	}
	tb.Skip("chromium is not installed; run scripts/services.sh (it installs Debian's chromium) to test pages in a browser")
	return ""
}

// New starts a headless Chromium with a fresh profile and nothing that
// reaches the network on its own, and returns the context of its first
// tab; chromedp.NewContext on it opens more tabs. The browser lives until
// the test ends, two minutes at most. opts add to or override the flags.
func New(tb testing.TB, opts ...chromedp.ExecAllocatorOption) context.Context {
	tb.Helper()
	all := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(ChromiumPath(tb)),
		chromedp.UserDataDir(tb.TempDir()),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(all, opts...)...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(tb.Logf))
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	tb.Cleanup(func() { cancelTimeout(); cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil {
		tb.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

package server

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"jobfence/handlers"
)

// TestBrowserJobAdmittedOverHTTPAppearsLive is dashboard must-show 4 on the
// whole server: a viewer keeps /jobs open in chromium, a job is admitted
// through POST /v1/jobs (as curl would), and its row appears within two
// seconds without a reload. The web package's browser tests use the pages
// alone; this one also proves the wiring from the API's write through the
// read model to the page's event stream.
func TestBrowserJobAdmittedOverHTTPAppearsLive(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
	}
	h := startAPI(t, nil)

	actx, acancel := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		acancel()
	})
	// The first action starts the browser and must not carry a timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	step := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
		defer scancel()
		if err := chromedp.Do(sctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	poll := func(expr string, limit time.Duration) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(limit))(ctx, tg)
			return err
		})
	}
	eval := func(expr string) bool {
		t.Helper()
		sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
		defer scancel()
		v, err := chromedp.Run(sctx, chromedp.Evaluate[bool](expr))
		if err != nil {
			t.Fatalf("evaluate %s: %v", expr, err)
		}
		return v
	}

	step("sign in as a viewer",
		chromedp.Navigate(h.base+"/jobs"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), apiTokens[handlers.RoleViewer]),
		chromedp.Submit(chromedp.CSS("#token")),
		chromedp.WaitVisible(chromedp.CSS("form.who")),
		chromedp.WaitVisible(chromedp.CSS("main h1")),
	)
	step("event stream open", poll(`document.body.getAttribute("data-stream") === "open"`, 10*time.Second))
	// A reload would drop this marker.
	eval(`(window.noReloadMarker = true)`)

	j := h.admit("live.curl/idx_fresh") // POST /v1/jobs with a submitter token
	step("the admitted job appears within two seconds",
		poll(`!!document.querySelector('tr[data-job="`+j.ID+`"]')`, 2*time.Second))
	if !eval(`window.noReloadMarker === true`) {
		t.Error("the page reloaded; it must update in place")
	}
}

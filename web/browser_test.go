package web

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"jobfence/jobs"
)

// artifactsDir is git-ignored; CI keeps it as the screenshots of the run.
var artifactsDir = filepath.Join("..", "test-artifacts")

// newBrowser starts Debian's chromium headless with a fresh profile. It
// skips only when chromium is not installed (.ci/run installs it).
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		acancel()
	})
	// The first Run starts the browser and must not carry a timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// step bounds one group of browser actions.
func step(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(sctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(sctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// screenshot saves the whole page as test-artifacts/<name>.png.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if err := os.MkdirAll(artifactsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(artifactsDir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// signIn uses the login form the way a person does.
func signIn(t *testing.T, ctx context.Context, base, token, next string, shot string) {
	t.Helper()
	step(t, ctx, "open the login form",
		chromedp.Navigate(base+next),
		chromedp.WaitVisible(chromedp.CSS("#token")),
	)
	if shot != "" {
		screenshot(t, ctx, shot)
	}
	step(t, ctx, "sign in",
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Submit(chromedp.CSS("#token")),
		chromedp.WaitVisible(chromedp.CSS("form.who")),
	)
}

// pollTrue waits, in the page, until expr is truthy or limit passes.
func pollTrue(expr string, limit time.Duration) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(limit))(ctx, tg)
		return err
	})
}

// waitLive waits until the page's EventSource is connected, so a change made
// after this point reaches the page.
func waitLive(t *testing.T, ctx context.Context) {
	t.Helper()
	step(t, ctx, "event stream open",
		pollTrue(`document.body.getAttribute("data-stream") === "open"`, 10*time.Second),
	)
}

// overflowJS names the outermost elements wider than the viewport, or "".
const overflowJS = `(() => {
	if (document.documentElement.scrollWidth <= window.innerWidth + 1) return "";
	const out = [];
	for (const el of document.querySelectorAll("main *, header *")) {
		if (el.getBoundingClientRect().right > window.innerWidth + 1 && !el.closest(".scroll") &&
			!(el.parentElement && el.parentElement.getBoundingClientRect().right > window.innerWidth + 1)) {
			out.push(el.tagName.toLowerCase() + (el.className ? "." + el.className : "") + ": " + (el.textContent || "").slice(0, 40));
		}
	}
	return out.slice(0, 5).join(" | ") || "page wider than the viewport";
})()`

// TestBrowserForceRelease is must-show 1: an operator signs in, finds the
// target fenced by an UNKNOWN job on /fences, force-releases it through the
// dialog with a note, and the row disappears without a reload. It saves a
// screenshot of every page at 1280 and 390 pixels wide.
func TestBrowserForceRelease(t *testing.T) {
	h := newHarness(t, withPeers)
	ctx := newBrowser(t)
	target := "warehouse.orders/idx_customer"
	j := h.unknown("warehouse.orders/IDX_Customer")
	pending := h.admit("billing/backfill_2025", "billing-ro")
	h.putAgent("agent-1")
	h.waitSynced(pending.Revision)
	base := h.srv.URL

	signIn(t, ctx, base, operatorToken, "/fences", "login")
	row := `tr[data-target="` + target + `"]`
	step(t, ctx, "find the fenced target", chromedp.WaitVisible(chromedp.CSS(row)))
	waitLive(t, ctx)
	screenshot(t, ctx, "fences-before")
	// A reload would drop this marker.
	eval[bool](t, ctx, `(window.noReloadMarker = true)`)

	dialog := "#release-" + j.ID
	step(t, ctx, "open the dialog",
		chromedp.Click(chromedp.CSS(row+` a[data-open-dialog]`)),
		chromedp.WaitVisible(chromedp.CSS(dialog)),
	)
	text := eval[string](t, ctx, `document.querySelector("`+dialog+`").innerText`)
	for _, want := range []string{"the fence on target " + target, "the slot it holds on agent agent-1", "may still be alive", "Late-commit warning"} {
		if !strings.Contains(text, want) {
			t.Errorf("the dialog does not say %q; it says:\n%s", want, text)
		}
	}
	if !eval[bool](t, ctx, `document.querySelector("`+dialog+`").open && document.activeElement.id === "note-`+j.ID+`"`) {
		t.Errorf("the open dialog does not put keyboard focus on its note field")
	}
	if label := eval[string](t, ctx, `document.querySelector("label[for='note-`+j.ID+`']").textContent`); !strings.Contains(label, "Note") {
		t.Errorf("the note field has no label (got %q)", label)
	}
	screenshot(t, ctx, "fences-release-dialog")

	// Escape closes it; the link, reached by keyboard, opens it again.
	step(t, ctx, "close the dialog with Escape",
		chromedp.KeyEvent(kb.Escape),
		pollTrue(`!document.querySelector("`+dialog+`").open`, 5*time.Second),
	)
	step(t, ctx, "reopen the dialog from the keyboard",
		chromedp.Focus(chromedp.CSS(row+` a[data-open-dialog]`)),
		chromedp.KeyEvent(kb.Enter),
		chromedp.WaitVisible(chromedp.CSS(dialog)),
	)

	note := "index checked by hand: build finished, fence safe to drop"
	step(t, ctx, "type the note and submit with the keyboard",
		chromedp.SendKeys(chromedp.CSS("#note-"+j.ID), note),
		chromedp.KeyEvent(kb.Enter),
	)
	step(t, ctx, "the fence row disappears",
		pollTrue(`document.querySelector('`+row+`') === null && !!document.getElementById("main")`, 15*time.Second),
	)
	if !eval[bool](t, ctx, `window.noReloadMarker === true`) {
		t.Errorf("the page reloaded; it must update in place")
	}
	if eval[bool](t, ctx, `!!document.querySelector("dialog[open]")`) {
		t.Errorf("the dialog is still open after the release")
	}
	screenshot(t, ctx, "fences-after")

	got, err := h.st.Get(context.Background(), j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Force == nil || got.Force.Note != note || got.Force.Actor != "olga" || got.State != jobs.Unknown || got.Slot.Held {
		t.Errorf("after the release: force=%+v state=%s slot=%+v", got.Force, got.State, got.Slot)
	}
	if h.fenced(target) {
		t.Errorf("the store still holds the fence on %s", target)
	}

	pages := map[string]string{
		"overview":    "/",
		"agents":      "/agents",
		"jobs":        "/jobs",
		"job":         "/jobs/" + j.ID,
		"job-pending": "/jobs/" + pending.ID,
		"fences":      "/fences",
	}
	for _, width := range []int64{1280, 390} {
		step(t, ctx, "set the viewport", chromedp.EmulateViewport(width, 900))
		for name, path := range pages {
			step(t, ctx, "open "+path,
				chromedp.Navigate(base+path),
				chromedp.WaitVisible(chromedp.CSS("main h1")),
			)
			if wide := eval[string](t, ctx, overflowJS); wide != "" {
				t.Errorf("%s at %d px scrolls sideways (only wide tables may scroll, inside their box): %s", path, width, wide)
			}
			screenshot(t, ctx, name+"-"+strconv.FormatInt(width, 10))
		}
	}
	step(t, ctx, "open the no-script release page of a released job", chromedp.Navigate(base+"/jobs/"+j.ID+"/force-release"), chromedp.WaitVisible(chromedp.CSS("main h1")))
	screenshot(t, ctx, "release-page-conflict")
}

// TestBrowserLiveJobs is must-show 4 (and the browser half of 2): a viewer
// keeps /jobs open, a job is admitted, and its row appears within two
// seconds without a reload; the viewer's /fences has no release control.
func TestBrowserLiveJobs(t *testing.T) {
	h := newHarness(t)
	ctx := newBrowser(t)
	j0 := h.unknown("warehouse.orders/idx_live")
	base := h.srv.URL

	signIn(t, ctx, base, viewerToken, "/fences", "")
	step(t, ctx, "viewer sees the fence", chromedp.WaitVisible(chromedp.CSS(`tr[data-job="`+j0.ID+`"]`)))
	if n := eval[int](t, ctx, `document.querySelectorAll("a[data-open-dialog], dialog, form[action*='force-release']").length`); n != 0 {
		t.Errorf("the viewer's /fences page has %d release controls, want none", n)
	}
	screenshot(t, ctx, "fences-viewer")

	step(t, ctx, "open /jobs", chromedp.Navigate(base+"/jobs"), chromedp.WaitVisible(chromedp.CSS("main h1")))
	waitLive(t, ctx)
	eval[bool](t, ctx, `(window.noReloadMarker = true)`)

	j := h.admit("warehouse.orders/idx_fresh", "")
	step(t, ctx, "the admitted job appears within two seconds",
		pollTrue(`!!document.querySelector('tr[data-job="`+j.ID+`"]')`, 2*time.Second),
	)
	if !eval[bool](t, ctx, `window.noReloadMarker === true`) {
		t.Errorf("the page reloaded; it must update in place")
	}
	screenshot(t, ctx, "jobs-live")
}

package web

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"jobfence/jobs"
)

func TestLoginSessionLogout(t *testing.T) {
	h := newHarness(t)
	c := h.client()

	res, _ := c.get("/fences")
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/login?next=%2Ffences" {
		t.Fatalf("GET /fences without a session: %d %q, want 303 to the login", res.StatusCode, res.Header.Get("Location"))
	}

	for _, bad := range []string{"tok-not-a-real-token-55aa", agentToken} {
		res, body := c.post("/login", url.Values{"token": {bad}})
		if res.StatusCode != http.StatusUnauthorized {
			t.Errorf("login with %s: status %d, want 401", testTokens[bad][1], res.StatusCode)
		}
		if strings.Contains(body, bad) {
			t.Errorf("the refused login page echoes the token")
		}
		if len(res.Cookies()) != 0 {
			t.Errorf("a refused login set a cookie")
		}
	}

	res, _ = c.post("/login", url.Values{"token": {operatorToken}, "next": {"/fences"}})
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/fences" {
		t.Fatalf("login: %d %q, want 303 to /fences", res.StatusCode, res.Header.Get("Location"))
	}
	var sess *http.Cookie
	for _, ck := range res.Cookies() {
		if ck.Name == cookieName {
			sess = ck
		}
	}
	if sess == nil {
		t.Fatal("login set no session cookie")
	}
	if !sess.HttpOnly || sess.SameSite != http.SameSiteStrictMode || sess.Path != "/" {
		t.Errorf("session cookie HttpOnly=%v SameSite=%v Path=%q, want HttpOnly, Strict, /", sess.HttpOnly, sess.SameSite, sess.Path)
	}
	if strings.Contains(sess.Value, operatorToken) || len(sess.Value) < 40 {
		t.Errorf("session cookie %q is not a random id", sess.Value)
	}

	res, body := c.get("/")
	if res.StatusCode != http.StatusOK || !strings.Contains(body, "olga (operator)") {
		t.Fatalf("overview after login: %d, signed-in user not shown", res.StatusCode)
	}
	csrf := csrfOf(t, body)

	// An open redirect through next is refused.
	res, _ = c.post("/login", url.Values{"token": {operatorToken}, "next": {"//evil.example/"}})
	if loc := res.Header.Get("Location"); loc != "/" {
		t.Errorf("login with next=//evil.example/ redirects to %q, want /", loc)
	}
	_, body = c.get("/")
	csrf = csrfOf(t, body)

	res, _ = c.post("/logout", url.Values{"csrf": {csrf}})
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: status %d, want 303", res.StatusCode)
	}
	// The old id is dead server-side, even if a client kept the cookie.
	old := h.client()
	old.jar.SetCookies(mustURL(t, h.srv.URL), []*http.Cookie{sess})
	if res, _ := old.get("/"); res.StatusCode != http.StatusSeeOther {
		t.Errorf("a logged-out session id still opens pages: status %d", res.StatusCode)
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestViewerCannotWrite is must-show 2: a viewer sees no release control,
// and a hand-made POST with the viewer's cookie and CSRF token is refused.
func TestViewerCannotWrite(t *testing.T) {
	h := newHarness(t)
	j := h.unknown("warehouse.orders/idx_viewer")
	c := h.client()
	csrf := c.login(viewerToken)

	for _, path := range []string{"/fences", "/jobs/" + j.ID, "/"} {
		res, body := c.get(path)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", path, res.StatusCode)
		}
		for _, bad := range []string{"force-release", "<dialog", "/settings/"} {
			if strings.Contains(body, bad) {
				t.Errorf("GET %s as a viewer shows a write control (%q)", path, bad)
			}
		}
	}
	_, body := c.get("/fences")
	if !strings.Contains(body, "warehouse.orders/idx_viewer") {
		t.Fatalf("the viewer's fences page does not show the fenced target")
	}
	if res, _ := c.get("/jobs/" + j.ID + "/force-release"); res.StatusCode != http.StatusForbidden {
		t.Errorf("GET the release page as a viewer: %d, want 403", res.StatusCode)
	}

	form := url.Values{"csrf": {csrf}, "note": {"viewer tries anyway"}}
	if res, _ := c.post("/jobs/"+j.ID+"/force-release", form); res.StatusCode != http.StatusForbidden {
		t.Errorf("viewer POST force-release: %d, want 403", res.StatusCode)
	}
	if res, _ := c.do("POST", "/jobs/"+j.ID+"/force-release", form, map[string]string{"X-CSRF-Token": csrf}); res.StatusCode != http.StatusForbidden {
		t.Errorf("viewer fetch-style force-release: %d, want 403", res.StatusCode)
	}
	if res, _ := c.post("/settings/admission", url.Values{"csrf": {csrf}, "open": {"false"}}); res.StatusCode != http.StatusForbidden {
		t.Errorf("viewer POST admission switch: %d, want 403", res.StatusCode)
	}

	got, err := h.st.Get(context.Background(), j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Force != nil || got.Resolved || !h.fenced("warehouse.orders/idx_viewer") {
		t.Errorf("a refused viewer write changed the job: force=%v resolved=%v", got.Force, got.Resolved)
	}
	if !h.st.Settings().AdmissionOpen {
		t.Errorf("a refused viewer write closed admission")
	}
}

// TestWriteNeedsCSRF is must-show 3: without the session's CSRF token an
// operator's write is refused and writes nothing; with it, it goes through.
func TestWriteNeedsCSRF(t *testing.T) {
	h := newHarness(t)
	target := "warehouse.orders/idx_csrf"
	j := h.unknown(target)
	op := h.client()
	csrf := op.login(operatorToken)
	other := h.client()
	otherCSRF := other.login(viewerToken)
	path := "/jobs/" + j.ID + "/force-release"

	cases := []struct {
		name   string
		c      *client
		form   url.Values
		header map[string]string
	}{
		{"no token", op, url.Values{"note": {"n"}}, nil},
		{"empty token", op, url.Values{"note": {"n"}, "csrf": {""}}, nil},
		{"wrong token", op, url.Values{"note": {"n"}, "csrf": {"x" + csrf}}, nil},
		{"another session's token", op, url.Values{"note": {"n"}, "csrf": {otherCSRF}}, nil},
		{"wrong header token", op, url.Values{"note": {"n"}}, map[string]string{"X-CSRF-Token": "nope"}},
		{"no session at all", h.client(), url.Values{"note": {"n"}, "csrf": {csrf}}, nil},
	}
	for _, tc := range cases {
		if res, _ := tc.c.do("POST", path, tc.form, tc.header); res.StatusCode != http.StatusForbidden {
			t.Errorf("%s: status %d, want 403", tc.name, res.StatusCode)
		}
	}
	if res, _ := op.post("/settings/dispatch", url.Values{"paused": {"true"}}); res.StatusCode != http.StatusForbidden {
		t.Errorf("dispatch switch without CSRF: %d, want 403", res.StatusCode)
	}
	if res, _ := op.post(path, url.Values{"csrf": {csrf}, "note": {""}}); res.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("release with an empty note: %d, want 422", res.StatusCode)
	}
	if res, _ := op.post(path, url.Values{"csrf": {csrf}, "note": {"bad\u202enote"}}); res.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("release with an RTL override in the note: %d, want 422", res.StatusCode)
	}
	got, _ := h.st.Get(context.Background(), j.ID)
	if got.Force != nil || !h.fenced(target) || h.st.Settings().DispatchPaused {
		t.Fatalf("a refused write changed something: force=%v fenced=%v paused=%v", got.Force, h.fenced(target), h.st.Settings().DispatchPaused)
	}

	// Without script the release link opens a page with the same form.
	res, page := op.get(path)
	if res.StatusCode != http.StatusOK || !strings.Contains(page, `name="note"`) || csrfOf(t, page) != csrf {
		t.Fatalf("GET %s: %d, want the release form carrying the session's CSRF token", path, res.StatusCode)
	}
	// A browser's cross-site form post is refused before any handler runs.
	if res, _ := op.do("POST", path, url.Values{"csrf": {csrf}, "note": {"n"}}, map[string]string{"Sec-Fetch-Site": "cross-site"}); res.StatusCode != http.StatusForbidden {
		t.Errorf("cross-site POST: %d, want 403", res.StatusCode)
	}

	// The same request with the token goes through (no script: 303 to the job).
	res, _ = op.post(path, url.Values{"csrf": {csrf}, "note": {"checked the index by hand"}})
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/jobs/"+j.ID {
		t.Fatalf("release with the token: %d %q, want 303 to the job", res.StatusCode, res.Header.Get("Location"))
	}
	got, err := h.st.Get(context.Background(), j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Force == nil || got.Force.Note != "checked the index by hand" || got.Force.Actor != "olga" || got.State != jobs.Unknown {
		t.Errorf("after release: force=%+v state=%s, want olga's note and the state kept UNKNOWN", got.Force, got.State)
	}
	waitFor(t, 5*time.Second, "the fence to leave the read model", func() bool { return !h.fenced(target) })

	if res, _ := op.get(path); res.StatusCode != http.StatusConflict {
		t.Errorf("GET the release page of a released job: %d, want 409", res.StatusCode)
	}

	res, _ = op.post("/settings/dispatch", url.Values{"csrf": {csrf}, "paused": {"true"}})
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("dispatch switch with CSRF: %d, want 303", res.StatusCode)
	}
	waitFor(t, 5*time.Second, "dispatch to be paused", func() bool { return h.st.Settings().DispatchPaused })
}

// TestNoSecretsInPages is must-show 6: tokens, the dispatch secret (and its
// hash) and a credential value are planted, and every page is scanned.
func TestNoSecretsInPages(t *testing.T) {
	h := newHarness(t)
	j := h.unknown("warehouse.orders/idx_secret")
	p := h.admit("billing/backfill_2025", "warehouse-rw")
	sum := sha256.Sum256([]byte(h.secret))
	planted := map[string]string{
		"operator token":  operatorToken,
		"viewer token":    viewerToken,
		"dispatch secret": h.secret,
		"secret hash":     hex.EncodeToString(sum[:]),
		"credential":      credentialValue,
	}
	full, err := h.st.Get(context.Background(), j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if full.Dispatch == nil || full.Dispatch.SecretHash == "" {
		t.Fatalf("the store kept no secret hash to plant")
	}
	planted["stored secret hash"] = full.Dispatch.SecretHash

	paths := []string{"/", "/fences", "/agents", "/jobs", "/jobs?state=UNKNOWN", "/jobs/" + j.ID, "/jobs/" + p.ID,
		"/jobs/" + j.ID + "/force-release", "/logout", "/login", "/static/app.js", "/static/app.css", "/nope"}
	for _, tok := range []string{operatorToken, viewerToken} {
		c := h.client()
		c.login(tok)
		for _, path := range paths {
			res, body := c.get(path)
			for what, v := range planted {
				if strings.Contains(body, v) {
					t.Errorf("GET %s as %s shows the %s", path, testTokens[tok][1], what)
				}
				for _, ck := range res.Cookies() {
					if strings.Contains(ck.Value, v) {
						t.Errorf("GET %s sets a cookie holding the %s", path, what)
					}
				}
			}
		}
		for _, ck := range c.jar.Cookies(mustURL(t, h.srv.URL)) {
			for what, v := range planted {
				if strings.Contains(ck.Value, v) {
					t.Errorf("the cookie jar holds the %s", what)
				}
			}
		}
	}
	// The pages did show the job, so the scan looked at real content.
	c := h.client()
	c.login(operatorToken)
	if _, body := c.get("/jobs/" + j.ID); !strings.Contains(body, "warehouse-rw") || !strings.Contains(body, full.Dispatch.InvocationID) {
		t.Errorf("the job page lacks its credential profile name or invocation id")
	}
}

func TestNotFoundAndBadFilters(t *testing.T) {
	h := newHarness(t)
	c := h.client()
	c.login(viewerToken)
	for path, want := range map[string]int{
		"/jobs/not-a-uuid":           http.StatusNotFound,
		"/jobs/" + uuid.NewString():  http.StatusNotFound,
		"/no-such-page":              http.StatusNotFound,
		"/jobs?state=SOMETIMES":      http.StatusBadRequest,
		"/jobs?scope=a%00b":          http.StatusBadRequest,
		"/jobs?page_token=%ff%fe%fd": http.StatusBadRequest,
		"/static/app.js":             http.StatusOK,
		"/static/does-not-exist.js":  http.StatusNotFound,
	} {
		res, _ := c.get(path)
		if res.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, res.StatusCode, want)
		}
		if want >= 400 && !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") && !strings.HasPrefix(path, "/static/") {
			t.Errorf("GET %s: error page is %q, want a plain HTML page", path, res.Header.Get("Content-Type"))
		}
	}
}

func TestJobsFilterAndPaging(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.PageSize = 2 })
	a := h.admit("alpha/one", "")
	b := h.admit("alpha/two", "")
	g := h.admit("gamma/three", "")
	h.waitSynced(g.Revision)
	c := h.client()
	c.login(viewerToken)

	_, body := c.get("/jobs?scope=alpha")
	if !strings.Contains(body, a.ID) || !strings.Contains(body, b.ID) || strings.Contains(body, g.ID) {
		t.Errorf("scope filter alpha: want jobs %s and %s only", a.ID, b.ID)
	}
	_, body = c.get("/jobs?target=gamma%2Fthree")
	if !strings.Contains(body, g.ID) || strings.Contains(body, a.ID) {
		t.Errorf("target filter gamma/three: want job %s only", g.ID)
	}

	seen := map[string]bool{}
	next := "/jobs"
	for pages := 0; next != ""; pages++ {
		if pages > 3 {
			t.Fatal("paging does not end")
		}
		_, body := c.get(next)
		for _, id := range []string{a.ID, b.ID, g.ID} {
			if strings.Contains(body, `data-job="`+id+`"`) {
				if seen[id] {
					t.Errorf("job %s on two pages", id)
				}
				seen[id] = true
			}
		}
		next = ""
		if m := nextRE.FindStringSubmatch(body); m != nil {
			next = strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	if len(seen) != 3 {
		t.Errorf("paging showed %d of 3 jobs", len(seen))
	}
}

var nextRE = regexp.MustCompile(`href="([^"]+)" rel="next"`)

// TestEventsStream checks /v1/events: problem+json refusals, and an event for
// an admitted job on both a Bearer token and a session cookie.
func TestEventsStream(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		auth string
		want int
	}{{"", 401}, {"Bearer nope-nope-nope-nope", 401}, {"Basic abc", 401}, {"Bearer " + agentToken, 403}} {
		req, _ := http.NewRequest("GET", h.srv.URL+"/v1/events", nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != tc.want || res.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("events with %q: %d %s, want %d problem+json", tc.auth, res.StatusCode, res.Header.Get("Content-Type"), tc.want)
		}
	}

	viewerSession := h.client()
	viewerSession.login(viewerToken)
	for _, mode := range []string{"bearer", "session"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", h.srv.URL+"/v1/events", nil)
		hc := http.DefaultClient
		if mode == "bearer" {
			req.Header.Set("Authorization", "Bearer "+viewerToken)
		} else {
			hc = &http.Client{Jar: viewerSession.jar}
		}
		res, err := hc.Do(req)
		if err != nil {
			cancel()
			t.Fatalf("%s: %v", mode, err)
		}
		if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("%s: %d %s", mode, res.StatusCode, res.Header.Get("Content-Type"))
		}
		j := h.admit("events/"+mode, "")
		sc := bufio.NewScanner(res.Body)
		found := false
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data: ") && strings.Contains(sc.Text(), j.ID) {
				found = true
				break
			}
		}
		cancel()
		res.Body.Close()
		if !found {
			t.Errorf("%s: no event named job %s", mode, j.ID)
		}
	}
}

// TestEventsEndWithSession: a stream opened on a session ends once that
// session is signed out, so a closed session cannot keep watching.
func TestEventsEndWithSession(t *testing.T) {
	h := newHarness(t)
	c := h.client()
	csrf := c.login(viewerToken)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", h.srv.URL+"/v1/events", nil)
	res, err := (&http.Client{Jar: c.jar}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("events: %d", res.StatusCode)
	}
	if r, _ := c.post("/logout", url.Values{"csrf": {csrf}}); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %d", r.StatusCode)
	}
	// The stream ends by itself at the next keep-alive (1s in the harness);
	// only the test's context bounds the wait.
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
	}
	if ctx.Err() != nil {
		t.Fatalf("the stream outlived its signed-out session")
	}
}

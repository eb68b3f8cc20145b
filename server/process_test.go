package server

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"jobfence/handlers"
	"jobfence/internal/apitest"
)

// buildJobfence compiles cmd/jobfence into dir.
func buildJobfence(t *testing.T, dir string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(dir, "jobfence")
	out, err := exec.Command(goBin, "build", "-o", bin, "jobfence/cmd/jobfence").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startProcess runs `jobfence server` and returns its address once it logs
// server_started.
func startProcess(t *testing.T, bin, dataDir, tokens string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(bin, "server", "--listen", "127.0.0.1:0", "--data-dir", dataDir,
		"--tokens-file", tokens, "--log-format", "json", "--election-ttl", "2s")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "server_started" {
				addr <- line.Addr
				break
			}
		}
		// Keep draining so the process never blocks on a full pipe.
		_, _ = io.Copy(io.Discard, stderr)
	}()
	select {
	case a := <-addr:
		return cmd, a
	case <-time.After(60 * time.Second):
		t.Fatal("jobfence server did not start within 60s")
	}
	return nil, ""
}

// Must-show 8: kill -9 right after a 201; on restart from the same data dir
// the job, its fence and its quota unit are there and the target is still
// fenced.
func TestProcessAdmittedJobSurvivesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the real binary")
	}
	dir := t.TempDir()
	bin := buildJobfence(t, dir)
	tokens := writeAPITokens(t, dir)
	dataDir := filepath.Join(dir, "data")

	cmd, addr := startProcess(t, bin, dataDir, tokens)
	h := &apiH{t: t, base: "http://" + addr, client: &http.Client{Transport: apitest.Transport(t, nil), Timeout: 30 * time.Second}}
	pollUntil(t, "first server ready", func() bool { return h.do("GET", "/readyz", "", nil).status == 200 })
	j := h.admit("crash.scope/Target-1")
	if err := cmd.Process.Signal(os.Kill); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	_, addr2 := startProcess(t, bin, dataDir, tokens)
	h.base = "http://" + addr2
	pollUntil(t, "restarted server ready", func() bool { return h.do("GET", "/readyz", "", nil).status == 200 })
	r := h.do("GET", "/v1/jobs/"+j.ID, handlers.RoleViewer, nil)
	var got jobView
	r.decode(t, &got)
	if r.status != 200 || got.ID != j.ID || got.State != "PENDING" || got.Revision != j.Revision {
		t.Fatalf("after restart: %d %s", r.status, r.body)
	}
	if holder := h.fences()["crash.scope/target-1"]; holder != j.ID {
		t.Errorf("fence holder after restart %q, want %s", holder, j.ID)
	}
	if g, s := h.quotaUse("crash.scope"); g != 1 || s != 1 {
		t.Errorf("quota after restart: global %d scope %d, want 1 and 1", g, s)
	}
	again := h.do("POST", "/v1/jobs", handlers.RoleSubmitter, jobBody("CRASH.scope/target-1"))
	if slug, p := again.problem(t); again.status != 409 || slug != "fence-held" || p["holder_job_id"] != j.ID {
		t.Errorf("second admission after restart: %d %s", again.status, again.body)
	}
}

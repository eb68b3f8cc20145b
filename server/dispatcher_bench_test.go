package server

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"jobfence/internal/etcdtest"
	"jobfence/internal/store"
	"jobfence/jobs"
)

// BenchmarkIdleServerWithRetainedJobs is must-show 10: a real server
// process leads over 10,000 retained terminal jobs for 30 s. It prints the
// etcd revision delta over the window (an idle round writes nothing, so it
// must be 0) and the process's CPU use. The measurement is one window, not
// b.N iterations.
func BenchmarkIdleServerWithRetainedJobs(b *testing.B) {
	const retained = 10000
	const window = 30 * time.Second
	cli := etcdtest.New(b)
	prefix := etcdtest.Prefix(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := store.New(store.Config{Client: cli, Prefix: prefix, QuotaGlobal: 10000, QuotaPerScope: 1000,
		Defaults: DefaultJobDefaults(), ReplicaID: "bench-loader"})
	if err != nil {
		b.Fatal(err)
	}
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = st.Run(ctx) }()
	defer func() { cancel(); <-runDone }()
	for !st.Ready() {
		time.Sleep(10 * time.Millisecond)
	}
	// Admit and cancel: each job ends NOT_COMMITTED and resolved, kept by
	// a retention of a week.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < retained; i += 16 {
				tg, _ := jobs.ParseTarget(fmt.Sprintf("s%d/t%d", i%8, i))
				j, _, err := st.Admit(ctx, store.AdmitInput{Target: tg, Actor: "bench", Spec: jobs.Spec{
					Command: []string{"/bin/true"}, Limits: jobs.Limits{MemoryBytes: 64 << 20, Pids: 8, DeadlineSeconds: 60},
					Outcome: jobs.Outcome{CommittedExitCodes: []int{0}, NotCommittedExitCodes: []int{}}}})
				if err == nil {
					_, err = st.Cancel(ctx, j.ID, "bench")
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}

	dir := b.TempDir()
	tokens := dir + "/tokens.json"
	raw, _ := json.Marshal([]map[string]string{{"subject": "v", "role": "viewer", "token": "bench-viewer-token-0123456789"}})
	dispatchToken := dir + "/dispatch-token"
	if err := os.WriteFile(tokens, raw, 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(dispatchToken, []byte(e2eDispatchToken), 0o600); err != nil {
		b.Fatal(err)
	}
	bin := e2eBuild(b)
	cmd := exec.Command(bin, e2eServerArgs(e2eServerSpec{ReplicaID: "bench"}, prefix, tokens, dispatchToken)...)
	logs := &syncBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	// Leading and past its first rounds (take-over, first retention pass)
	// before the window opens.
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(logs.String(), "dispatcher_started") {
		if time.Now().After(deadline) {
			b.Fatalf("server did not lead:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)

	rev := func() int64 {
		resp, err := cli.Get(ctx, "bench-revision-probe")
		if err != nil {
			b.Fatal(err)
		}
		return resp.Header.Revision
	}
	rev0, cpu0 := rev(), procCPU(b, cmd.Process.Pid)
	b.ResetTimer()
	time.Sleep(window)
	b.StopTimer()
	rev1, cpu1 := rev(), procCPU(b, cmd.Process.Pid)
	cpu := cpu1 - cpu0
	b.ReportMetric(float64(rev1-rev0), "etcd-revisions")
	b.ReportMetric(cpu.Seconds(), "cpu-s")
	b.ReportMetric(100*cpu.Seconds()/window.Seconds(), "cpu-%")
	fmt.Printf("idle leader over %d retained terminal jobs for %s: etcd revision delta %d (must be 0), server CPU %.2fs (%.1f%% of one core)\n",
		retained, window, rev1-rev0, cpu.Seconds(), 100*cpu.Seconds()/window.Seconds())
	if rev1 != rev0 {
		b.Errorf("idle rounds wrote to etcd: revision %d -> %d", rev0, rev1)
	}
}

// procCPU is the user+system time of pid from /proc/<pid>/stat.
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the parenthesised command name; utime and stime are the
	// 14th and 15th fields of the line.
	rest := string(raw[strings.LastIndexByte(string(raw), ')')+2:])
	f := strings.Fields(rest)
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	stt, _ := strconv.ParseInt(f[12], 10, 64)
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(ut+stt) * time.Second / ticks
}

//go:build linux

package isolation

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"
)

// BenchmarkDomainLifecycle measures the whole domain lifecycle of /bin/true
// (create and limit the cgroups, fork and exec parked at the exec stop,
// attach and check, release, exit, reap, empty, remove) next to a plain
// fork/exec of /bin/true, in the same run. With no shim process in between
// the lifecycle is the fork/exec plus a few cgroup file operations. b.N is
// ignored: -benchtime 1x runs the body once and the figures come from the
// fixed sample size.
func BenchmarkDomainLifecycle(b *testing.B) {
	const n = 200
	h := testHost(b)
	trueBin, err := exec.LookPath("true")
	if err != nil {
		b.Skip("no true binary")
	}
	for i := 0; i < b.N; i++ {
		dom := make([]time.Duration, 0, n)
		ref := make([]time.Duration, 0, n)
		for j := 0; j < n; j++ {
			t0 := time.Now()
			res, err := h.Run(context.Background(), Spec{
				Name: "bench" + strconv.Itoa(j), Argv: []string{trueBin},
				MemoryBytes: 64 << 20, Pids: 16, ReapBound: 5 * time.Second,
			})
			if err != nil || !res.ReapProof() || !res.Removed || res.ExitCode != 0 {
				b.Fatalf("lifecycle %d: %v %+v", j, err, res)
			}
			dom = append(dom, time.Since(t0))
			t0 = time.Now()
			if err := exec.Command(trueBin).Run(); err != nil {
				b.Fatal(err)
			}
			ref = append(ref, time.Since(t0))
		}
		dm, dp := quantiles(dom)
		rm, rp := quantiles(ref)
		b.ReportMetric(dm, "median-ms")
		b.ReportMetric(dp, "p99-ms")
		b.ReportMetric(rm, "ref-median-ms")
		b.ReportMetric(rp, "ref-p99-ms")
		fmt.Printf("domain lifecycle of true (%s, n=%d): median %.3f ms, p99 %.3f ms\n", h.Report().Mode, n, dm, dp)
		fmt.Printf("plain fork/exec of true (n=%d): median %.3f ms, p99 %.3f ms\n", n, rm, rp)
		fmt.Printf("BENCH isolation_lifecycle value=%.3f reference=%.3f ratio=%.2f floor=6 goal=3\n", dm, rm, dm/rm)
	}
}

func quantiles(ds []time.Duration) (median, p99 float64) {
	s := slices.Clone(ds)
	slices.Sort(s)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return ms(s[len(s)/2]), ms(s[min(len(s)-1, len(s)*99/100)])
}

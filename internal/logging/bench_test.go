package logging

import (
	"errors"
	"fmt"
	"io"
	"testing"
	"time"
)

// BenchmarkRedactingPipeline measures a record through redaction, the JSON
// sink and the ring with 200 registered values (a busy agent's dispatch
// secrets and credentials). Each iteration logs a fixed batch, so the figure
// is meaningful with -benchtime 1x.
func BenchmarkRedactingPipeline(b *testing.B) {
	red := NewRedactor()
	for i := range 200 {
		red.Add(fmt.Sprintf("registered-secret-%04d-abcdef", i))
	}
	lg, _ := New(Config{Writer: io.Discard}, red)
	lg = lg.With("component", "dispatcher", "replica", "r1")
	err := errors.New("dial tcp 10.0.0.7:9443: connection refused")
	const batch = 20000
	var total time.Duration
	for range b.N {
		start := time.Now()
		for i := range batch {
			lg.Info("job_dispatched", "job_id", "0193e1f2-7c1a-7b6e-9a55-0d1b2c3d4e5f", "i", i,
				"detail", "send failed: registered-secret-0042-abcdef", "err", err)
		}
		total += time.Since(start)
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N*batch), "ns/record")
}

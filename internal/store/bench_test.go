package store

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// BenchmarkAdmissionAttempts admits from 64 concurrent clients into one
// scope and reports admission transactions per admission (goal <= 1.05) and
// admissions per second. The whole measurement is one iteration body, so
// -benchtime 1x measures it fully.
func BenchmarkAdmissionAttempts(b *testing.B) {
	const clients, perClient = 64, 12
	h := newHarness(b, nil)
	var elapsed time.Duration
	b.ResetTimer()
	for n := range b.N {
		a0, w0 := h.st.AdmitAttempts()
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, clients)
		for c := range clients {
			wg.Go(func() {
				for i := range perClient {
					if _, _, err := h.st.Admit(h.ctx, admitInput(b, fmt.Sprintf("bench/n%d-c%d-i%d", n, c, i))); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		elapsed += time.Since(start)
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		a1, w1 := h.st.AdmitAttempts()
		if w1-w0 != clients*perClient {
			b.Fatalf("%d admissions, want %d", w1-w0, clients*perClient)
		}
		b.ReportMetric(float64(a1-a0)/float64(w1-w0), "attempts/admission")
	}
	b.StopTimer()
	_, total := h.st.AdmitAttempts()
	b.ReportMetric(float64(total)/elapsed.Seconds(), "admissions/s")
}

package store

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkAdmitVsRawTxn sets store.Admit at 64 concurrent callers on
// distinct targets beside the raw admission-shaped transaction at 64 on the
// same etcd and client, alternating three rounds and keeping the best of
// each, so the gap between them is the store's own cost (the read model's
// catch-up, encoding, token picking). The figures are the output.
func BenchmarkAdmitVsRawTxn(b *testing.B) {
	const clients, each, rounds = 64, 20, 3
	h := newHarness(b, func(c *Config) { c.QuotaGlobal, c.QuotaPerScope = 100000, 1000 })
	record := bytes.Repeat([]byte("x"), 900)
	b.ResetTimer()
	for n := range b.N {
		var admitRate, rawRate float64
		for r := range rounds {
			admitRate = max(admitRate, runClients(b, clients, each, func(c, k int) error {
				_, _, err := h.st.Admit(h.ctx, admitInput(b, fmt.Sprintf("s%d/n%d-r%d-k%d", c, n, r, k)))
				return err
			}))
			prefix := fmt.Sprintf("%s-raw/%d/%d", h.prefix, n, r)
			rawRate = max(rawRate, runClients(b, clients, each, func(c, k int) error {
				return rawAdmission(h.ctx, h.cli, prefix, c, k, record)
			}))
		}
		b.ReportMetric(admitRate, "admissions/s")
		b.ReportMetric(rawRate, "raw_txn/s")
		b.ReportMetric(admitRate/rawRate, "ratio")
		fmt.Printf("BENCH admission_store_ratio value=%.0f reference=%.0f ratio=%.3f floor=- goal=-\n", admitRate, rawRate, admitRate/rawRate)
	}
}

// runClients runs fn(c, k) for k < each on each of clients goroutines and
// returns calls per second.
func runClients(b *testing.B, clients, each int, fn func(c, k int) error) float64 {
	b.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, clients)
	for c := range clients {
		wg.Go(func() {
			<-start
			for k := range each {
				if err := fn(c, k); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(t0)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return float64(clients*each) / elapsed.Seconds()
}

func rawAdmission(ctx context.Context, cli *clientv3.Client, prefix string, c, k int, record []byte) error {
	id := uuid.NewString()
	job := prefix + "/jobs/" + id
	fence := fmt.Sprintf("%s/fences/s%d%%2Ft%d", prefix, c, k)
	qg := fmt.Sprintf("%s/quota/global/%d-%d", prefix, c, k)
	qs := fmt.Sprintf("%s/quota/scope/s%d/%d", prefix, c, k)
	resp, err := cli.Txn(ctx).If(
		clientv3.Compare(clientv3.CreateRevision(job), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(fence), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(qg), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(qs), "=", 0),
	).Then(
		clientv3.OpPut(job, string(record)),
		clientv3.OpPut(fence, id),
		clientv3.OpPut(qg, id),
		clientv3.OpPut(qs, id),
	).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("reference transaction lost a compare")
	}
	return nil
}

package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"jobfence/handlers"
	"jobfence/internal/etcdtest"
	"jobfence/internal/store"
	"jobfence/jobs"
)

const (
	benchClients = 64
	benchEach    = 15 // admissions per client per measurement
	// benchRounds alternates HTTP and raw measurements; the best round of
	// each is kept, so load from other processes on a shared machine skews
	// both sides alike instead of whichever ran during a spike.
	benchRounds = 3
)

// BenchmarkAdmission prints admissions/s over HTTP at 64 keep-alive clients
// on distinct targets next to the raw admission-shaped etcd transaction at 64
// concurrent clients on the same etcd in the same run, and the store's
// attempts per admission with 64 clients in one scope. The figures are the
// output; nothing here is asserted against a clock.
func BenchmarkAdmission(b *testing.B) {
	h := startAPI(b, func(c *Config) {
		c.QuotaGlobal = 100000
		c.QuotaPerScope = 50000
	})
	tr := &http.Transport{MaxIdleConnsPerHost: benchClients, MaxConnsPerHost: benchClients}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdtest.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	rawPrefix := etcdtest.Prefix(b) + "-raw"
	// A record the size the store writes, so the reference moves as many bytes.
	record := bytes.Repeat([]byte("x"), 900)

	for iter := 0; iter < b.N; iter++ {
		// Warm the connections and the read model.
		benchHTTP(b, client, h.base, fmt.Sprintf("warm%d", iter), 2, func(c int) string { return fmt.Sprintf("warm%d-%d", iter, c) })

		var httpRate, rawRate, storeRate float64
		for round := range benchRounds {
			httpRate = max(httpRate, benchHTTP(b, client, h.base, fmt.Sprintf("r%d", round), benchEach,
				func(c int) string { return fmt.Sprintf("ratio%d-%d", iter, c) }))
			rawRate = max(rawRate, benchRaw(b, raw, fmt.Sprintf("%s/%d/%d", rawPrefix, iter, round), record))
			storeRate = max(storeRate, benchStore(b, h.srv.Store(), fmt.Sprintf("d%d-%d", iter, round)))
		}

		a0, n0 := h.srv.Store().AdmitAttempts()
		benchHTTP(b, client, h.base, fmt.Sprintf("o%d", iter), benchEach, func(int) string { return fmt.Sprintf("onescope%d", iter) })
		a1, n1 := h.srv.Store().AdmitAttempts()
		attempts := float64(a1-a0) / float64(max(n1-n0, 1))

		b.ReportMetric(httpRate, "admissions/s")
		b.ReportMetric(rawRate, "raw_txn/s")
		b.ReportMetric(httpRate/rawRate, "ratio")
		b.ReportMetric(attempts, "attempts/admission")
		fmt.Printf("BENCH admission_ratio value=%.0f reference=%.0f ratio=%.3f floor=0.5 goal=0.7\n", httpRate, rawRate, httpRate/rawRate)
		// Where the time goes: the store's Admit called directly, without HTTP.
		fmt.Printf("BENCH admission_store_direct value=%.0f http_share=%.3f\n", storeRate, httpRate/storeRate)
		fmt.Printf("BENCH admission_attempts_one_scope value=%.3f floor=1.05 goal=1.01\n", attempts)
	}
}

// benchHTTP runs 64 clients, each admitting `each` jobs on targets of its own
// (scope(c)/<tag>-<c>-<k>), and returns admissions per second.
func benchHTTP(b *testing.B, client *http.Client, base, tag string, each int, scope func(c int) string) float64 {
	b.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, benchClients)
	for c := range benchClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for k := range each {
				body := fmt.Sprintf(`{"target":"%s/%s-%d-%d","command":["/bin/true"]}`, scope(c), tag, c, k)
				req, _ := http.NewRequest("POST", base+"/v1/jobs", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+apiTokens[handlers.RoleSubmitter])
				resp, err := client.Do(req)
				if err != nil {
					errs <- err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					errs <- fmt.Errorf("admission answered %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(t0)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return float64(benchClients*each) / elapsed.Seconds()
}

// benchStore admits through store.Admit directly at the same concurrency.
func benchStore(b *testing.B, st *store.Store, tag string) float64 {
	b.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, benchClients)
	for c := range benchClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for k := range benchEach {
				target, err := jobs.ParseTarget(fmt.Sprintf("direct%d/%s-%d", c, tag, k))
				if err != nil {
					errs <- err
					return
				}
				spec := jobs.Spec{Command: []string{"/bin/true"}, Limits: jobs.Limits{MemoryBytes: 256 << 20, Pids: 256, DeadlineSeconds: 3600},
					Outcome: jobs.Outcome{CommittedExitCodes: []int{0}, NotCommittedExitCodes: []int{}}, WorkingDir: "/"}
				if _, _, err := st.Admit(context.Background(), store.AdmitInput{Target: target, Spec: spec, Actor: "bench"}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(t0)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return float64(benchClients*benchEach) / elapsed.Seconds()
}

// benchRaw is the floor an admission cannot beat: one transaction that
// creates a record, a fence and two quota keys if none exists, at the same
// concurrency and through the same kind of client.
func benchRaw(b *testing.B, cli *clientv3.Client, prefix string, record []byte) float64 {
	b.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, benchClients)
	for c := range benchClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for k := range benchEach {
				id := uuid.NewString()
				job := fmt.Sprintf("%s/jobs/%s", prefix, id)
				fence := fmt.Sprintf("%s/fences/s%d%%2Ft%d", prefix, c, k)
				qg := fmt.Sprintf("%s/quota/global/%d", prefix, c*benchEach+k)
				qs := fmt.Sprintf("%s/quota/scope/s%d/%d", prefix, c, k)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
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
				cancel()
				if err != nil {
					errs <- err
					return
				}
				if !resp.Succeeded {
					errs <- fmt.Errorf("reference transaction lost a compare")
					return
				}
			}
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(t0)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return float64(benchClients*benchEach) / elapsed.Seconds()
}

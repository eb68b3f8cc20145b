package chaos

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// proxy sits on one direction of agent ↔ server traffic and misbehaves on
// command: it drops requests (the connection is reset before forwarding),
// drops answers (forwarded, then reset), delays (which reorders concurrent
// requests), duplicates, holds result reports back, and keeps every result
// body so a fault can replay it later. Bodies stay in memory: they carry
// dispatch secrets and are never logged.
type proxy struct {
	url    string
	target func() string
	client *http.Client

	mu          sync.Mutex
	rng         *rand.Rand
	dropReq     float64
	dropAnswer  float64
	dup         float64
	delayMax    time.Duration
	hold        chan struct{} // non-nil: result reports wait for it
	results     [][]byte      // result bodies seen, by path
	resultPaths []string
	// beforeForward / afterForward run for requests whose path ends with
	// hookSuffix; a fault uses them to kill the agent at an exact point.
	hookSuffix    string
	beforeForward func()
	afterForward  func()

	stats struct{ dropped, answersDropped, duplicated, delayed, held int }
}

func startProxy(t *testing.T, target func() string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	p := &proxy{url: "http://" + ln.Addr().String(), target: target, rng: rand.New(rand.NewPCG(1, 2)),
		client: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(p.serve)}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		p.heal()
		_ = srv.Close()
		tr.CloseIdleConnections()
	})
	return p
}

func (p *proxy) seed(s uint64) {
	p.mu.Lock()
	p.rng = rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
	p.mu.Unlock()
}

// lossy sets the misbehaviour rates; heal clears them and releases held reports.
func (p *proxy) lossy(dropReq, dropAnswer, dup float64, delayMax time.Duration) {
	p.mu.Lock()
	p.dropReq, p.dropAnswer, p.dup, p.delayMax = dropReq, dropAnswer, dup, delayMax
	p.mu.Unlock()
}

func (p *proxy) holdResults() {
	p.mu.Lock()
	if p.hold == nil {
		p.hold = make(chan struct{})
	}
	p.mu.Unlock()
}

func (p *proxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropReq, p.dropAnswer, p.dup, p.delayMax = 0, 0, 0, 0
	p.beforeForward, p.afterForward, p.hookSuffix = nil, nil, ""
	if p.hold != nil {
		close(p.hold)
		p.hold = nil
	}
}

func (p *proxy) setHook(suffix string, before, after func()) {
	p.mu.Lock()
	p.hookSuffix, p.beforeForward, p.afterForward = suffix, before, after
	p.mu.Unlock()
}

// recorded returns the result bodies seen so far (path and body).
func (p *proxy) recorded() ([]string, [][]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.resultPaths...), append([][]byte(nil), p.results...)
}

func (p *proxy) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	if err != nil {
		return
	}
	isResult := r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/result")
	p.mu.Lock()
	if isResult {
		p.results = append(p.results, body)
		p.resultPaths = append(p.resultPaths, r.URL.Path)
	}
	hold := p.hold
	dropReq := p.rng.Float64() < p.dropReq
	dropAnswer := p.rng.Float64() < p.dropAnswer
	dup := p.rng.Float64() < p.dup
	var delay time.Duration
	if p.delayMax > 0 {
		delay = time.Duration(p.rng.Int64N(int64(p.delayMax)))
	}
	var before, after func()
	if p.hookSuffix != "" && strings.HasSuffix(r.URL.Path, p.hookSuffix) && r.Method == http.MethodPost {
		before, after = p.beforeForward, p.afterForward
		p.beforeForward, p.afterForward, p.hookSuffix = nil, nil, ""
	}
	switch {
	case dropReq:
		p.stats.dropped++
	case dropAnswer:
		p.stats.answersDropped++
	}
	if dup {
		p.stats.duplicated++
	}
	if delay > 0 {
		p.stats.delayed++
	}
	if isResult && hold != nil {
		p.stats.held++
	}
	p.mu.Unlock()

	if isResult && hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	if dropReq {
		reset(w)
		return
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	if before != nil {
		before()
	}
	status, hdr, answer, ok := p.forward(r, body)
	if dup {
		_, _, _, _ = p.forward(r, body)
	}
	if after != nil {
		after()
	}
	if !ok {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	if dropAnswer {
		reset(w)
		return
	}
	for k, v := range hdr {
		w.Header()[k] = v
	}
	w.WriteHeader(status)
	_, _ = w.Write(answer)
}

func (p *proxy) forward(r *http.Request, body []byte) (int, http.Header, []byte, bool) {
	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.target()+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, false
	}
	req.Header = r.Header.Clone()
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, nil, nil, false
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, nil, false
	}
	return resp.StatusCode, resp.Header, raw, true
}

// reset closes the client's connection without an answer, the way a
// partition or a crashed peer looks to it.
func reset(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic("proxy: no hijacker")
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

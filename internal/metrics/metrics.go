// Package metrics holds jobfence's Prometheus definitions with their fixed
// names, one registry per constructor (a server's and an agent's), so tests
// and several instances in one process never collide.
//
// Every label takes a value from a fixed set (see the exported lists); any
// other value is recorded as "other". Callers pass enum values only, never
// error text, target names or anything a request carried.
package metrics

import (
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Snapshot is the read-model part of the server's gauges, taken when a
// scrape asks rather than on every change.
type Snapshot struct {
	LagRevisions int64
	// Jobs counts jobs by state (jobs.State values); states not present are 0.
	Jobs       map[string]int
	FencesHeld int
}

// Server holds the server's metrics.
type Server struct {
	reg         *prometheus.Registry
	admissions  *prometheus.CounterVec
	transitions *prometheus.CounterVec
	dispatches  *prometheus.CounterVec
	phases      *prometheus.HistogramVec
	leader      prometheus.Gauge
	state       *stateCollector
}

// NewServer returns the server's metrics in their own registry, with the Go
// and process collectors and every known label value present at zero.
func NewServer() *Server {
	s := &Server{
		reg: prometheus.NewRegistry(),
		admissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobfence_admissions_total",
			Help: "Job submissions by outcome.",
		}, []string{"outcome"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobfence_transitions_total",
			Help: "Job transitions applied, by event.",
		}, []string{"event"}),
		dispatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobfence_dispatch_outcomes_total",
			Help: "Dispatch sends by classification (enqueued, refused, unknown).",
		}, []string{"classification"}),
		phases: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "jobfence_round_phase_seconds",
			Help: "Duration of each phase of a dispatcher round.",
			// 0.5 ms to about 8 s: an idle phase reads memory only, and the
			// default phase budget is 5 s.
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 15),
		}, []string{"phase"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jobfence_leader",
			Help: "1 while this replica holds leadership.",
		}),
		state: newStateCollector(),
	}
	for _, v := range AdmissionOutcomes {
		s.admissions.WithLabelValues(v)
	}
	for _, v := range TransitionEvents {
		s.transitions.WithLabelValues(v)
	}
	for _, v := range DispatchClassifications {
		s.dispatches.WithLabelValues(v)
	}
	for _, v := range RoundPhases {
		s.phases.WithLabelValues(v)
	}
	s.reg.MustRegister(s.admissions, s.transitions, s.dispatches, s.phases, s.leader, s.state,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return s
}

// Registry is where other parts (the HTTP API's request counter) register
// their own collectors so one /metrics serves them all.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Handler serves the registry in the Prometheus exposition format.
func (s *Server) Handler() http.Handler {
	return promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg})
}

// AdmissionOutcome counts one submission; outcome is one of AdmissionOutcomes.
func (s *Server) AdmissionOutcome(outcome string) {
	s.admissions.WithLabelValues(known(AdmissionOutcomes, outcome)).Inc()
}

// Transition counts one applied transition; event is a jobs.Event value.
func (s *Server) Transition(event string) {
	s.transitions.WithLabelValues(known(TransitionEvents, event)).Inc()
}

// DispatchOutcome counts one send; c is one of DispatchClassifications.
func (s *Server) DispatchOutcome(c string) {
	s.dispatches.WithLabelValues(known(DispatchClassifications, c)).Inc()
}

// ObservePhase records how long one round phase took; phase is one of RoundPhases.
func (s *Server) ObservePhase(phase string, d time.Duration) {
	s.phases.WithLabelValues(known(RoundPhases, phase)).Observe(d.Seconds())
}

// SetLeader records whether this replica leads.
func (s *Server) SetLeader(leader bool) {
	if leader {
		s.leader.Set(1)
	} else {
		s.leader.Set(0)
	}
}

// SetLag records how many revisions the read model is behind. Ignored while
// a snapshot func is set.
func (s *Server) SetLag(n int64) {
	s.state.update(func(sn *Snapshot) { sn.LagRevisions = n })
}

// SetJobs records the job count of each state. Ignored while a snapshot func is set.
func (s *Server) SetJobs(byState map[string]int) {
	c := make(map[string]int, len(byState))
	for k, v := range byState {
		c[k] = v
	}
	s.state.update(func(sn *Snapshot) { sn.Jobs = c })
}

// SetFencesHeld records how many fences are held. Ignored while a snapshot func is set.
func (s *Server) SetFencesHeld(n int) {
	s.state.update(func(sn *Snapshot) { sn.FencesHeld = n })
}

// SetSnapshot makes every scrape read the lag, job and fence gauges from f,
// so the read model is asked once per scrape instead of told on every
// change. f must be cheap and safe to call from any goroutine; nil returns
// to the values given by SetLag, SetJobs and SetFencesHeld.
func (s *Server) SetSnapshot(f func() Snapshot) {
	s.state.mu.Lock()
	s.state.snap = f
	s.state.mu.Unlock()
}

// stateCollector emits the read-model gauges from a snapshot at scrape time.
type stateCollector struct {
	lag, jobs, fences *prometheus.Desc

	mu   sync.Mutex
	set  Snapshot
	snap func() Snapshot
}

func newStateCollector() *stateCollector {
	return &stateCollector{
		lag: prometheus.NewDesc("jobfence_read_model_lag_revisions",
			"Revisions the read model is behind the latest etcd revision it knows of.", nil, nil),
		jobs: prometheus.NewDesc("jobfence_jobs",
			"Jobs in the read model by state.", []string{"state"}, nil),
		fences: prometheus.NewDesc("jobfence_fences_held",
			"Targets fenced by an unresolved job.", nil, nil),
	}
}

func (c *stateCollector) update(f func(*Snapshot)) {
	c.mu.Lock()
	f(&c.set)
	c.mu.Unlock()
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.lag
	ch <- c.jobs
	ch <- c.fences
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	sn, f := c.set, c.snap
	c.mu.Unlock()
	// Called outside the lock: the snapshot func may take the read model's
	// own lock, and a slow one must not block SetJobs callers.
	if f != nil {
		sn = f()
	}
	byState := make(map[string]int, len(JobStates)+1)
	for _, s := range JobStates {
		byState[s] = 0
	}
	for s, n := range sn.Jobs {
		byState[known(JobStates, s)] += n
	}
	ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(sn.LagRevisions))
	ch <- prometheus.MustNewConstMetric(c.fences, prometheus.GaugeValue, float64(sn.FencesHeld))
	for s, n := range byState {
		ch <- prometheus.MustNewConstMetric(c.jobs, prometheus.GaugeValue, float64(n), s)
	}
}

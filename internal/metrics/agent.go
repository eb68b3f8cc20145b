package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Agent holds an agent's metrics.
type Agent struct {
	reg            *prometheus.Registry
	queueDepth     prometheus.Gauge
	inflight       prometheus.Gauge
	outcomes       *prometheus.CounterVec
	reportFailures prometheus.Counter
	verified       prometheus.Gauge
}

// NewAgent returns an agent's metrics in their own registry, with the Go and
// process collectors and every result code present at zero.
func NewAgent() *Agent {
	a := &Agent{
		reg: prometheus.NewRegistry(),
		queueDepth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jobfence_agent_queue_depth",
			Help: "Accepted dispatches waiting for an executor.",
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jobfence_agent_inflight_workers",
			Help: "Executors running a dispatch (domain alive or report pending).",
		}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobfence_agent_outcomes_total",
			Help: "Classified outcomes by result code.",
		}, []string{"code"}),
		reportFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jobfence_agent_report_failures_total",
			Help: "Result report attempts the server did not acknowledge.",
		}),
		verified: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jobfence_agent_isolation_verified",
			Help: "1 when the isolation preflight verified this host.",
		}),
	}
	for _, c := range ResultCodes {
		a.outcomes.WithLabelValues(c)
	}
	a.reg.MustRegister(a.queueDepth, a.inflight, a.outcomes, a.reportFailures, a.verified,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return a
}

// Registry is where other agent parts register their own collectors.
func (a *Agent) Registry() *prometheus.Registry { return a.reg }

// Handler serves the registry in the Prometheus exposition format.
func (a *Agent) Handler() http.Handler {
	return promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{Registry: a.reg})
}

// SetQueueDepth records how many accepted dispatches wait for an executor.
func (a *Agent) SetQueueDepth(n int) { a.queueDepth.Set(float64(n)) }

// SetInflightWorkers records how many executors hold a dispatch.
func (a *Agent) SetInflightWorkers(n int) { a.inflight.Set(float64(n)) }

// AddInflightWorkers moves the in-flight count by delta as an executor takes
// (+1) or finishes (-1) a dispatch.
func (a *Agent) AddInflightWorkers(delta int) { a.inflight.Add(float64(delta)) }

// Outcome counts one classified outcome; code is a jobs.ResultCode value.
func (a *Agent) Outcome(code string) {
	a.outcomes.WithLabelValues(known(ResultCodes, code)).Inc()
}

// ReportFailure counts one result report the server did not acknowledge.
func (a *Agent) ReportFailure() { a.reportFailures.Inc() }

// SetIsolationVerified records the preflight's verdict.
func (a *Agent) SetIsolationVerified(ok bool) {
	if ok {
		a.verified.Set(1)
	} else {
		a.verified.Set(0)
	}
}

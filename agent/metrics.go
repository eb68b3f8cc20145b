package agent

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

type metrics struct {
	reg            *prometheus.Registry
	queueDepth     prometheus.Gauge
	inflight       prometheus.Gauge
	outcomes       *prometheus.CounterVec
	reportFailures prometheus.Counter
	verified       prometheus.Gauge
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		queueDepth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jobfence_agent_queue_depth", Help: "Accepted dispatches waiting for an executor."}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jobfence_agent_inflight_workers", Help: "Executors running a dispatch (domain alive or report pending)."}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jobfence_agent_outcomes_total", Help: "Classified outcomes by result code."}, []string{"code"}),
		reportFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jobfence_agent_report_failures_total", Help: "Result report attempts that the server did not acknowledge."}),
		verified: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jobfence_agent_isolation_verified", Help: "1 when the isolation preflight verified this host."}),
	}
	m.reg.MustRegister(m.queueDepth, m.inflight, m.outcomes, m.reportFailures, m.verified,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Package fenceprom exports a pgfence.Client's signals as Prometheus metrics (client_golang): its
// kept leases, their losses by reason, the latency of its acquires and renewals, and its
// leaderships. The client itself has no Prometheus dependency: this package is its Observer.
//
//	m := fenceprom.New()
//	prometheus.MustRegister(m)
//	client := pgfence.NewClient(pool)
//	client.Observer = m // before the client's first call
//
// The metrics (a ConstLabels option adds labels to each, e.g. a client's name):
//
//	pgfence_leases_kept                        gauge      kept leases held now
//	pgfence_lease_losses_total{reason}         counter    kept leases lost while held, by reason
//	                                                      (expired, revoked, taken_over, session_ended,
//	                                                      restarted, unreachable, unknown)
//	pgfence_acquire_duration_seconds{outcome}  histogram  acquires, retries and the wait included
//	                                                      (granted, refused, error)
//	pgfence_renew_duration_seconds{outcome}    histogram  renewal calls of kept leases (ok, lost, error)
//	pgfence_renew_leases                       histogram  kept leases renewed by one call (batched)
//	pgfence_leader{election}                   gauge      1 while this client leads the election
//	                                                      (the elector's key), else 0
//
// A lease's key is no label (keys are unbounded); an election's key is, since an application has a
// few.
package fenceprom

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"pgfence.io/pgfence"
)

// Metrics is a pgfence.Observer and a prometheus.Collector: set it as the client's Observer and
// register it.
type Metrics struct {
	kept     prometheus.Gauge
	losses   *prometheus.CounterVec
	acquire  *prometheus.HistogramVec
	renew    *prometheus.HistogramVec
	renewed  prometheus.Histogram
	leader   *prometheus.GaugeVec
	mu       sync.Mutex
	leading  map[string]int // guarded by mu: leaderships held per election
	children []prometheus.Collector
}

// Option changes how New makes the metrics.
type Option func(*options)

type options struct {
	labels  prometheus.Labels
	buckets []float64
}

// ConstLabels adds labels with fixed values to every metric (e.g. {"client": "orders"} when an
// application has several clients).
func ConstLabels(labels prometheus.Labels) Option {
	return func(o *options) { o.labels = labels }
}

// Buckets sets the duration histograms' buckets, in seconds (prometheus.DefBuckets when not set:
// 5 ms to 10 s).
func Buckets(buckets []float64) Option {
	return func(o *options) { o.buckets = buckets }
}

// New makes the metrics, each at zero (every reason and outcome, so that a rate of zero shows as
// such).
func New(opts ...Option) *Metrics {
	o := options{buckets: prometheus.DefBuckets}
	for _, opt := range opts {
		opt(&o)
	}
	m := &Metrics{
		kept: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pgfence_leases_kept", Help: "Kept leases held now.", ConstLabels: o.labels}),
		losses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgfence_lease_losses_total", Help: "Kept leases lost while held, by reason.", ConstLabels: o.labels},
			[]string{"reason"}),
		acquire: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "pgfence_acquire_duration_seconds", Help: "Acquires, retries and the wait for the key included, by outcome.",
			ConstLabels: o.labels, Buckets: o.buckets},
			[]string{"outcome"}),
		renew: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "pgfence_renew_duration_seconds", Help: "Renewal calls of kept leases, by outcome.",
			ConstLabels: o.labels, Buckets: o.buckets},
			[]string{"outcome"}),
		renewed: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "pgfence_renew_leases", Help: "Kept leases renewed by one renewal call.",
			ConstLabels: o.labels, Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128}}),
		leader: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pgfence_leader", Help: "1 while this client leads the election (the elector's key), else 0.", ConstLabels: o.labels},
			[]string{"election"}),
		leading: map[string]int{},
	}
	for _, r := range []pgfence.LossReason{pgfence.ReasonExpired, pgfence.ReasonRevoked, pgfence.ReasonTakenOver,
		pgfence.ReasonSessionEnded, pgfence.ReasonRestarted, pgfence.ReasonUnreachable, pgfence.ReasonUnknown} {
		m.losses.WithLabelValues(string(r))
	}
	for _, outcome := range []pgfence.AcquireOutcome{pgfence.AcquireGranted, pgfence.AcquireRefused, pgfence.AcquireError} {
		m.acquire.WithLabelValues(string(outcome))
	}
	for _, outcome := range []pgfence.RenewOutcome{pgfence.RenewOK, pgfence.RenewLost, pgfence.RenewError} {
		m.renew.WithLabelValues(string(outcome))
	}
	m.children = []prometheus.Collector{m.kept, m.losses, m.acquire, m.renew, m.renewed, m.leader}
	return m
}

var _ pgfence.Observer = (*Metrics)(nil)
var _ prometheus.Collector = (*Metrics)(nil)

// Describe sends the metrics' descriptions.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.children {
		c.Describe(ch)
	}
}

// Collect sends the metrics' values.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.children {
		c.Collect(ch)
	}
}

// AcquireFinished observes the acquire's duration under its outcome.
func (m *Metrics) AcquireFinished(took time.Duration, outcome pgfence.AcquireOutcome) {
	m.acquire.WithLabelValues(string(outcome)).Observe(took.Seconds())
}

// RenewFinished observes the renewal call's duration under its outcome, and its leases.
func (m *Metrics) RenewFinished(took time.Duration, outcome pgfence.RenewOutcome, leases int) {
	m.renew.WithLabelValues(string(outcome)).Observe(took.Seconds())
	m.renewed.Observe(float64(leases))
}

// KeptLeaseStarted counts the kept lease.
func (m *Metrics) KeptLeaseStarted(*pgfence.KeptLease) { m.kept.Inc() }

// KeptLeaseEnded counts the kept lease out.
func (m *Metrics) KeptLeaseEnded(*pgfence.KeptLease) { m.kept.Dec() }

// LeaseLost counts the loss under its reason.
func (m *Metrics) LeaseLost(_ *pgfence.KeptLease, reason pgfence.LossReason) {
	m.losses.WithLabelValues(string(reason)).Inc()
}

// LeadershipGained sets the election's gauge to 1.
func (m *Metrics) LeadershipGained(election string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.leading[election]++
	m.leader.WithLabelValues(election).Set(1)
}

// LeadershipLost sets the election's gauge to 0 once no leadership of it is left.
func (m *Metrics) LeadershipLost(election string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.leading[election] > 0 {
		m.leading[election]--
	}
	if m.leading[election] == 0 {
		m.leader.WithLabelValues(election).Set(0)
	}
}

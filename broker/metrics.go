package broker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mirrorworker/mirrorworker/clock"
)

// ConnCollector exports the state of a NATS connection at scrape time:
// mirrorworker_nats_connected (1 connected, 0 otherwise, including before
// the first connection) and mirrorworker_nats_reconnects_total. The
// connection is set once it exists, so the collector can be registered
// before. Safe for concurrent use.
type ConnCollector struct {
	conn       atomic.Pointer[nats.Conn]
	connected  *prometheus.Desc
	reconnects *prometheus.Desc
}

var _ prometheus.Collector = (*ConnCollector)(nil)

// NewConnCollector returns a collector with no connection yet.
func NewConnCollector() *ConnCollector {
	return &ConnCollector{
		connected: prometheus.NewDesc("mirrorworker_nats_connected",
			"1 while the worker's NATS connection is connected, 0 while connecting, reconnecting or closed.", nil, nil),
		reconnects: prometheus.NewDesc("mirrorworker_nats_reconnects_total",
			"Reconnections of the worker's NATS connection.", nil, nil),
	}
}

// SetConn sets the connection to report; nil reports disconnected.
func (c *ConnCollector) SetConn(nc *nats.Conn) { c.conn.Store(nc) }

// Describe implements prometheus.Collector.
func (c *ConnCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.connected
	ch <- c.reconnects
}

// Collect implements prometheus.Collector.
func (c *ConnCollector) Collect(ch chan<- prometheus.Metric) {
	var up, reconnects float64
	if nc := c.conn.Load(); nc != nil {
		if nc.IsConnected() {
			up = 1
		}
		reconnects = float64(nc.Stats().Reconnects)
	}
	ch <- prometheus.MustNewConstMetric(c.connected, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(c.reconnects, prometheus.CounterValue, reconnects)
}

// ConsumerRef names a JetStream consumer.
type ConsumerRef struct {
	Stream, Consumer string
}

// Default refresh bounds of a ConsumerLagCollector.
const (
	DefaultLagInterval = 5 * time.Second
	DefaultLagTimeout  = 2 * time.Second
)

// ConsumerLagOptions configures a ConsumerLagCollector. A zero field means
// the default on it.
type ConsumerLagOptions struct {
	// Consumers lists the consumers to read at each refresh, so that a
	// layout that changes (partitions taken or given up) is followed.
	// Required.
	Consumers func() []ConsumerRef
	// Interval is the least time between two reads of consumer info;
	// scrapes in between get the last values. Default DefaultLagInterval.
	Interval time.Duration
	// Timeout bounds one refresh of all consumers; default DefaultLagTimeout.
	Timeout time.Duration
	// Clock defaults to the wall clock.
	Clock clock.Clock
}

// ConsumerLagCollector exports the backlog of JetStream consumers read from
// consumer info: mirrorworker_consumer_pending (messages not yet delivered),
// mirrorworker_consumer_ack_pending (delivered, not yet acknowledged),
// mirrorworker_consumer_redelivered, each labelled {stream, consumer}, and
// mirrorworker_consumer_info_errors_total. Consumer info is one small
// request per consumer, made at scrape time and at most once per Interval
// whatever the number of scrapers. A consumer whose info cannot be read
// keeps its last values until the next refresh. Safe for concurrent use.
type ConsumerLagCollector struct {
	js jetstream.JetStream
	o  ConsumerLagOptions

	pending, ackPending, redelivered, errorsDesc *prometheus.Desc

	mu     sync.Mutex // held across the refresh: concurrent scrapes wait for one read
	read   time.Time  // last refresh
	last   map[ConsumerRef]lag
	errors uint64
}

type lag struct {
	pending, ackPending, redelivered float64
}

var _ prometheus.Collector = (*ConsumerLagCollector)(nil)

// NewConsumerLagCollector returns a collector reading through js.
func NewConsumerLagCollector(js jetstream.JetStream, o ConsumerLagOptions) *ConsumerLagCollector {
	if o.Interval <= 0 {
		o.Interval = DefaultLagInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultLagTimeout
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Consumers == nil {
		o.Consumers = func() []ConsumerRef { return nil }
	}
	labels := []string{"stream", "consumer"}
	return &ConsumerLagCollector{
		js: js, o: o, last: map[ConsumerRef]lag{},
		pending: prometheus.NewDesc("mirrorworker_consumer_pending",
			"Messages of the consumer's stream not yet delivered (consumer info num_pending).", labels, nil),
		ackPending: prometheus.NewDesc("mirrorworker_consumer_ack_pending",
			"Messages delivered and not yet acknowledged (consumer info num_ack_pending), deferred jobs included.", labels, nil),
		redelivered: prometheus.NewDesc("mirrorworker_consumer_redelivered",
			"Messages delivered more than once and not yet acknowledged (consumer info num_redelivered).", labels, nil),
		errorsDesc: prometheus.NewDesc("mirrorworker_consumer_info_errors_total",
			"Consumer info reads that failed (NATS unreachable, consumer missing).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *ConsumerLagCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.ackPending
	ch <- c.redelivered
	ch <- c.errorsDesc
}

// Collect implements prometheus.Collector.
func (c *ConsumerLagCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := c.o.Clock.Now(); c.read.IsZero() || now.Sub(c.read) >= c.o.Interval {
		c.refreshLocked()
		c.read = now
	}
	for ref, l := range c.last {
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, l.pending, ref.Stream, ref.Consumer)
		ch <- prometheus.MustNewConstMetric(c.ackPending, prometheus.GaugeValue, l.ackPending, ref.Stream, ref.Consumer)
		ch <- prometheus.MustNewConstMetric(c.redelivered, prometheus.GaugeValue, l.redelivered, ref.Stream, ref.Consumer)
	}
	ch <- prometheus.MustNewConstMetric(c.errorsDesc, prometheus.CounterValue, float64(c.errors))
}

// refreshLocked reads the info of every listed consumer; consumers no
// longer listed are forgotten. c.mu must be held.
func (c *ConsumerLagCollector) refreshLocked() {
	ctx, cancel := context.WithTimeout(context.Background(), c.o.Timeout)
	defer cancel()
	refs := c.o.Consumers()
	keep := make(map[ConsumerRef]bool, len(refs))
	for _, ref := range refs {
		keep[ref] = true
		cons, err := c.js.Consumer(ctx, ref.Stream, ref.Consumer)
		if err != nil {
			c.errors++
			continue
		}
		ci := cons.CachedInfo() // Consumer() just fetched it: one request per consumer
		c.last[ref] = lag{
			pending:     float64(ci.NumPending),
			ackPending:  float64(ci.NumAckPending),
			redelivered: float64(ci.NumRedelivered),
		}
	}
	for ref := range c.last {
		if !keep[ref] {
			delete(c.last, ref)
		}
	}
}

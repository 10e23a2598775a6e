package worker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// ackResendWindow is how far back from a lost connection the plain acks
// of done jobs are sent again once the connection is back: far more
// than the acks a dead socket can swallow (those written in the last
// round trip) and than a single server's consumer state lags behind
// what it has applied (nats-server writes it at most every 100 ms).
const ackResendWindow = 10 * time.Second

// ackModeEvery is how often the worker looks again at the jobs stream's
// replicas and place, which decide how a done job is acked (acks.confirmed).
const ackModeEvery = time.Minute

// acks sends the ack of a job whose work is done (stored, unchanged,
// handed over, moved). What keeps it from being lost depends on where
// the jobs stream lives (plainAcks; docs/adr/0036, twelfth pass):
//
//   - replicated, or on another server of a cluster: a confirmed ack,
//     retried until a consumer leader answers (confirmedAck,
//     docs/adr/0009). A plain ack sent while a leader is being elected, or
//     while the stream's server is down, is dropped with no error, and its
//     job is fetched again after AckWait.
//   - one replica on the server the worker is connected to: a plain ack,
//     remembered for ackResendWindow. There is no leader to lose and no
//     route to cross; what can swallow an ack is a connection that drops
//     with it in flight, or the server crashing before it writes the
//     consumer's state (every 100 ms, so a confirmed ack is lost the same
//     way). When the connection drops, the acks of the last
//     ackResendWindow are sent again as soon as it is back (nats.go keeps
//     those published meanwhile and sends them first). An ack of a message
//     already acked changes nothing on the server. With a batch
//     (Options.AckBatch) a plain ack first waits for the upkeep's next
//     flush, so each partition consumer's state changes in bursts.
//
// Safe for concurrent use.
type acks struct {
	nc  *nats.Conn
	js  jetstream.JetStream // where refresh reads the jobs stream
	clk clock.Clock
	log zerolog.Logger
	// confirm: acks are confirmed (not plainAcks; refresh).
	confirm atomic.Bool
	read    atomic.Bool // refresh has read the stream once

	// batch is Options.AckBatch: how long a plain ack may wait (in
	// batched) for the next flush; 0 sends each at once.
	batch time.Duration

	mu      sync.Mutex
	batched []Msg     // plain acks waiting for the next flush (batch > 0)
	sent    []sentAck // the plain acks of the last ackResendWindow, oldest first
	lost    []string  // reply subjects to ack again once the connection is back
	// resent counts the acks sent again (tests, the log).
	resent atomic.Int64
}

// ackBody is a plain ack's payload (nats.go's jetstream sends the same).
var ackBody = []byte("+ACK")

type sentAck struct {
	at    time.Time
	reply string
}

// handlersMu serializes newAcks' read and replacement of a connection's
// handlers.
var handlersMu sync.Mutex

// newAcks returns the acks sent on js's connection (js nil: always
// confirmed, for tests without a connection): it chains its own disconnect
// and reconnect handlers after the connection's.
func newAcks(js jetstream.JetStream, clk clock.Clock, log zerolog.Logger, batch time.Duration) *acks {
	a := &acks{js: js, clk: clk, log: log, batch: batch}
	if js != nil {
		a.nc = js.Conn()
	}
	nc := a.nc
	a.confirm.Store(true) // until refresh has read the stream
	if nc == nil {
		return a
	}
	handlersMu.Lock() // two workers on one connection each chain theirs
	defer handlersMu.Unlock()
	prevD, prevR := nc.DisconnectErrHandler(), nc.ReconnectHandler()
	nc.SetDisconnectErrHandler(func(c *nats.Conn, err error) {
		if prevD != nil {
			prevD(c, err)
		}
		a.disconnected()
	})
	nc.SetReconnectHandler(func(c *nats.Conn) {
		if prevR != nil {
			prevR(c)
		}
		a.reconnected()
	})
	return a
}

// refresh reads the jobs stream's replicas and where it lives (plainAcks).
// On an error the mode is left as it was.
func (a *acks) refresh(ctx context.Context) {
	if a.js == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := a.js.Stream(ctx, jobs.JobsStream)
	if err != nil {
		a.log.Debug().Err(err).Msg("jobs stream's replicas not read; acks sent as before")
		return
	}
	info := s.CachedInfo()
	leader := ""
	if info.Cluster != nil {
		leader = info.Cluster.Leader
	}
	connected := a.nc.ConnectedServerName()
	confirm := !plainAcks(info.Config.Replicas, leader, connected)
	if a.confirm.Swap(confirm) != confirm || !a.read.Swap(true) {
		a.log.Debug().Int("replicas", info.Config.Replicas).Str("leader", leader).Str("connected_to", connected).
			Bool("confirmed", confirm).Msg("acks of done jobs")
	}
}

// plainAcks says whether a done job's ack may be plain: the jobs stream
// has one replica, and it is on the server the worker is connected to. On
// another server of a cluster, an ack sent while that server is down is
// dropped with no error and no reconnect of the worker's own connection
// to send it again: that ack is confirmed.
func plainAcks(replicas int, leader, connected string) bool {
	return replicas <= 1 && leader != "" && leader == connected
}

// upkeep refreshes the mode every ackModeEvery and, with a batch, sends
// the batched acks every batch, until ctx ends; then it sends what is
// batched. A stream's replicas can be raised while the worker runs.
func (a *acks) upkeep(ctx context.Context) {
	defer a.flush()
	mode := a.clk.NewTimer(ackModeEvery)
	defer mode.Stop()
	var batch clock.Timer
	var batchC <-chan time.Time // nil without a batch: never ready
	if a.batch > 0 {
		batch = a.clk.NewTimer(a.batch)
		defer batch.Stop()
		batchC = batch.C()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-mode.C():
			a.refresh(ctx)
			mode.Reset(ackModeEvery)
		case <-batchC:
			a.flush()
			batch.Reset(a.batch)
		}
	}
}

// confirmed says whether a done job's ack must be confirmed (see acks):
// until refresh has read the stream, and wherever plainAcks says no.
func (a *acks) confirmed() bool { return a.confirm.Load() }

// plain sends m's ack plainly, with a batch at the next flush, and
// remembers it for ackResendWindow, or, while the connection is down, keeps
// it for the next reconnect.
func (a *acks) plain(m Msg) error {
	if a.batch > 0 {
		a.mu.Lock()
		a.batched = append(a.batched, m)
		a.mu.Unlock()
		return nil
	}
	return a.send(m)
}

// flush sends the batched acks. One that fails for another reason than a
// connection being re-established (whose acks wait for the reconnect)
// leaves its job to come back after AckWait, and says so.
func (a *acks) flush() {
	a.mu.Lock()
	b := a.batched
	a.batched = nil
	a.mu.Unlock()
	var failed int
	var last error
	for _, m := range b {
		if err := a.send(m); err != nil {
			failed, last = failed+1, err
		}
	}
	if failed > 0 {
		a.log.Warn().Err(last).Int("acks", failed).Msg("acks of done jobs not sent: those jobs come back after their ack wait, and are found stored")
	}
}

// send sends m's ack plainly and remembers it for ackResendWindow (plain).
func (a *acks) send(m Msg) error {
	err := m.Ack()
	now := a.clk.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		if errors.Is(err, nats.ErrReconnectBufExceeded) || a.nc.IsReconnecting() {
			a.lost = append(a.lost, m.Reply())
			return nil // sent once the connection is back
		}
		return err
	}
	cut := 0
	for cut < len(a.sent) && now.Sub(a.sent[cut].at) > ackResendWindow {
		cut++
	}
	a.sent = append(a.sent[cut:], sentAck{at: now, reply: m.Reply()})
	return nil
}

// disconnected keeps the acks of the last ackResendWindow to send again.
func (a *acks) disconnected() {
	now := a.clk.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.sent {
		if now.Sub(s.at) <= ackResendWindow {
			a.lost = append(a.lost, s.reply)
		}
	}
	a.sent = nil
}

// reconnected sends again the acks kept when the connection dropped, and
// reads the mode again: the connection may now be to another server.
func (a *acks) reconnected() {
	go a.refresh(context.Background()) // not on nats.go's callback goroutine
	a.mu.Lock()
	lost := a.lost
	a.lost = nil
	a.mu.Unlock()
	if len(lost) == 0 {
		return
	}
	var failed []string
	for _, reply := range lost {
		if err := a.nc.Publish(reply, ackBody); err != nil {
			failed = append(failed, reply)
		}
	}
	a.resent.Add(int64(len(lost) - len(failed)))
	ev := a.log.Info()
	if len(failed) > 0 {
		// The connection dropped again (or its buffer is full): they go
		// with the next reconnect.
		a.mu.Lock()
		a.lost = append(a.lost, failed...)
		a.mu.Unlock()
		ev = a.log.Warn().Int("kept_for_the_next_reconnect", len(failed))
	}
	ev.Int("acks", len(lost)).Msg("NATS reconnected: acks of the jobs done before the connection dropped sent again (they may have been lost with it)")
}

package worker

import (
	"strconv"
	"testing"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// TestAWakeUpWithoutRoomWakesNoIntake: with memory full, each job that
// leaves it pokes the worker (Worker.finish), but an intake pulls only once
// the room reaches its low water mark: the pokes before that wake the
// dispatcher and no intake, the one that reaches it wakes one. Waking an
// intake at every poke cost 2.9 wake-ups, timers and scheduler reads a job
// in the throughput benchmark (ADR 0036, tenth pass).
func TestAWakeUpWithoutRoomWakesNoIntake(t *testing.T) {
	const maxHeld, pullBatch = 80, 16
	p := pacer.New(&pacer.Options{Policy: policy(0, maxHeld)})
	w := &Worker{
		o:     Options{MaxHeld: maxHeld, PullBatch: pullBatch},
		sched: newTestSched(p, func(o *schedOptions) { o.slots, o.maxHeld, o.maxPerAuth = maxHeld, maxHeld, maxHeld }),
		kick:  make(chan struct{}, 1),
		space: make(chan struct{}, 1),
	}
	w.lowWater.Store(int64(max(1, min(pullBatch, maxHeld/8)))) // as New sets it: 10
	lowWater := int(w.lowWater.Load())
	for i := range maxHeld {
		if _, deferred := w.sched.admit(t0, testJob(t, uint64(i+1), "http://a.test/"+strconv.Itoa(i), "default")); deferred {
			t.Fatalf("job %d deferred", i)
		}
	}
	grants, _, _ := w.sched.next(t0)
	if len(grants) != maxHeld {
		t.Fatalf("%d grants, want %d", len(grants), maxHeld)
	}
	for i, g := range grants[:lowWater] {
		w.sched.fetching(g.job)
		w.sched.finished(t0, g.job, 0, false) // the job leaves memory
		w.poke()
		room := maxHeld - w.sched.held()
		if room != i+1 {
			t.Fatalf("room %d after %d jobs left, want %d", room, i+1, i+1)
		}
		select {
		case <-w.kick: // drained, to see the next poke kick it too
		default:
			t.Fatalf("poke %d did not kick the dispatcher", i+1)
		}
		woken := len(w.space) == 1
		if want := room >= lowWater; woken != want {
			t.Fatalf("room %d (low water %d): intake woken %v, want %v", room, lowWater, woken, want)
		}
	}
	// Room reserved by a pull in progress is not room: no wake-up.
	<-w.space
	w.pulling.Add(1)
	w.wakeIntake()
	if len(w.space) != 0 {
		t.Fatal("woken with the room under the low water mark once a pull reserved some")
	}
	w.pulling.Add(-1)
	w.wakeIntake()
	if len(w.space) != 1 {
		t.Fatal("not woken once the pull gave its room back")
	}
}

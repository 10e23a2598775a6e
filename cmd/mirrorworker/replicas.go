package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// maxReplicas is JetStream's own limit on the replicas of a stream.
const maxReplicas = 5

// registerReplicasFlag adds --stream-replicas, shared by run, enqueue and
// replay so that each sizes the streams, the bucket and the consumer alike.
func registerReplicasFlag(fs *flag.FlagSet, v *int) {
	fs.IntVar(v, "stream-replicas", 0, "JetStream replicas of every mirrorworker stream, the attempts bucket and the consumer "+
		"(1 to 5; 3 on a 3-node NATS cluster). run sets existing ones to it; enqueue and replay only raise them. "+
		"Unset (0): new ones get 1 and existing ones keep theirs")
}

func checkReplicas(bad func(format string, a ...any), n int) {
	if n < 0 || n > maxReplicas {
		bad("--stream-replicas %d: want 1 to %d (or 0, unset)", n, maxReplicas)
	}
}

// replicasHint adds what to do to a JetStream error about replicas.
func replicasHint(err error, replicas int) error {
	var apiErr *jetstream.APIError
	if err == nil || !errors.As(err, &apiErr) {
		return err
	}
	msg := strings.ToLower(apiErr.Description)
	switch {
	case strings.Contains(msg, "replicas") && strings.Contains(msg, "clustered"):
		return fmt.Errorf("%w (this NATS server is not clustered: leave --stream-replicas unset or 1)", err)
	case strings.Contains(msg, "insufficient resources") || strings.Contains(msg, "no suitable peers"):
		return fmt.Errorf("%w (the NATS cluster has fewer JetStream servers than --stream-replicas %d, or they are out of storage)", err, replicas)
	}
	return err
}

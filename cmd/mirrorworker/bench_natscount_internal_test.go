package main

import (
	"testing"

	"github.com/nats-io/nats.go"
)

// TestSubjectTapClasses keeps the tap's classes honest: a reply is counted
// under the request that named its inbox, and a delivery (which keeps its
// stream subject on the wire) by the stream of its ack subject.
func TestSubjectTapClasses(t *testing.T) {
	t.Parallel()
	status := func(code string) nats.Header { return nats.Header{"Status": []string{code}} }
	tap := &subjectTap{inboxOf: map[string]string{}, counts: map[string]subjectCount{}}
	for _, c := range []struct {
		name string
		msg  *nats.Msg
		want string
	}{
		{name: "pull request", msg: &nats.Msg{Subject: "$JS.API.CONSUMER.MSG.NEXT.MIRROR_JOBS.p07", Reply: "_INBOX.a.1"},
			want: "$JS.API.CONSUMER.MSG.NEXT (pull request)"},
		{name: "delivery to it", msg: &nats.Msg{Subject: "mirror.jobs.t.k.07", Reply: "$JS.ACK.MIRROR_JOBS.p07.1.5.5.0.9"},
			want: "  delivery from MIRROR_JOBS"},
		{name: "its expiry", msg: &nats.Msg{Subject: "_INBOX.a.1", Header: status("408")},
			want: "  status 408 (to $JS.API.CONSUMER.MSG.NEXT (pull request))"},
		{name: "its heartbeat", msg: &nats.Msg{Subject: "_INBOX.a.1", Header: status("100")},
			want: "  heartbeat / flow control (to $JS.API.CONSUMER.MSG.NEXT (pull request))"},
		{name: "confirmed ack", msg: &nats.Msg{Subject: "$JS.ACK.MIRROR_JOBS.p07.1.5.5.0.9", Reply: "_INBOX.b.2", Data: []byte("+ACK")},
			want: "$JS.ACK.MIRROR_JOBS +ACK"},
		{name: "its confirmation", msg: &nats.Msg{Subject: "_INBOX.b.2"}, want: "  reply (to $JS.ACK.MIRROR_JOBS +ACK)"},
		{name: "plain ack", msg: &nats.Msg{Subject: "$JS.ACK.RAW.raw.1.5.5.0.9"}, want: "$JS.ACK.RAW +ACK"},
		{name: "nak", msg: &nats.Msg{Subject: "$JS.ACK.RAW.raw.1.5.5.0.9", Data: []byte(`-NAK {"delay":1}`)}, want: "$JS.ACK.RAW -NAK"},
		{name: "kv put", msg: &nats.Msg{Subject: "$KV.MIRROR_LEASES.p07", Reply: "_INBOX.c.3"}, want: "$KV.MIRROR_LEASES (put)"},
		{name: "kv get", msg: &nats.Msg{Subject: "$JS.API.DIRECT.GET.KV_MIRROR_ATTEMPTS.$KV.MIRROR_ATTEMPTS.x"}, want: "$JS.API.DIRECT.GET.KV_MIRROR_ATTEMPTS"},
		{name: "consumer info", msg: &nats.Msg{Subject: "$JS.API.CONSUMER.INFO.MIRROR_JOBS.p07"}, want: "$JS.API.CONSUMER.INFO"},
		{name: "unknown inbox", msg: &nats.Msg{Subject: "_INBOX.z.9"}, want: "  reply (to unknown request)"},
		{name: "a publish", msg: &nats.Msg{Subject: "mirror.events.a.b"}, want: "mirror.events"},
	} {
		if got := tap.classifyLocked(c.msg); got != c.want {
			t.Errorf("%s: class %q, want %q", c.name, got, c.want)
		}
	}
}

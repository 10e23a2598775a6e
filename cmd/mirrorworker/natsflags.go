package main

import (
	"context"
	"flag"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/nats-io/nats.go"
)

// natsFlags are the flags every subcommand that talks to NATS shares.
type natsFlags struct {
	url       string
	creds     string
	nkey      string
	user      string
	password  string
	tlsCA     string
	tlsCert   string
	tlsKey    string
	defaultTo string // used when url is empty and the caller does not embed
}

func (n *natsFlags) register(fs *flag.FlagSet, urlHelp string) {
	fs.StringVar(&n.url, "nats-url", "", urlHelp)
	fs.StringVar(&n.creds, "nats-creds", "", "NATS credentials file (JWT and seed)")
	fs.StringVar(&n.nkey, "nats-nkey", "", "NATS NKey seed file")
	fs.StringVar(&n.user, "nats-user", "", "NATS user name")
	fs.StringVar(&n.password, "nats-password", "", "NATS password (prefer MIRRORWORKER_NATS_PASSWORD over the command line)")
	fs.StringVar(&n.tlsCA, "nats-tls-ca", "", "PEM file of root CAs for the NATS TLS connection")
	fs.StringVar(&n.tlsCert, "nats-tls-cert", "", "client certificate for NATS TLS (with --nats-tls-key)")
	fs.StringVar(&n.tlsKey, "nats-tls-key", "", "client key for NATS TLS")
}

// connect dials n.url, or n.defaultTo when n.url is empty.
func (n *natsFlags) connect(ctx context.Context, name string, extra ...nats.Option) (*nats.Conn, error) {
	u := n.url
	if u == "" {
		u = n.defaultTo
	}
	return broker.Connect(ctx, broker.ConnectOptions{
		URL: u, Name: name, CredsFile: n.creds, NKeyFile: n.nkey,
		User: n.user, Password: n.password,
		TLSCA: n.tlsCA, TLSCert: n.tlsCert, TLSKey: n.tlsKey,
	}, extra...)
}

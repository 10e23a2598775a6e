package broker

import (
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// ClientLogOptions route a client connection's reports into log: nats.go's
// asynchronous errors (without an ErrorHandler it prints them to stderr as
// plain text, such as "write tcp ...: broken pipe on connection [5]"),
// disconnects and reconnects. Pass them to Connect or Embedded.Connect.
func ClientLogOptions(log zerolog.Logger) []nats.Option {
	return []nats.Option{
		nats.ErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
			ev := log.Warn().Err(err)
			if nc != nil {
				if id, e := nc.GetClientID(); e == nil {
					ev = ev.Uint64("nats_client_id", id)
				}
			}
			if sub != nil {
				ev = ev.Str("subject", sub.Subject)
			}
			ev.Msg("NATS asynchronous error")
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: our own Close at exit
				log.Warn().Err(err).Msg("NATS disconnected")
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info().Str("nats_url", RedactURL(nc.ConnectedUrl())).Msg("NATS reconnected")
		}),
	}
}

// serverLogger is the embedded server's logger on a zerolog.Logger. The
// server's notices (start-up banner, listen addresses) are debug lines: the
// worker's own start line says what an operator needs.
type serverLogger struct{ l zerolog.Logger }

var _ server.Logger = serverLogger{}

func (s serverLogger) Noticef(format string, v ...any) { s.l.Debug().Msgf(format, v...) }
func (s serverLogger) Warnf(format string, v ...any)   { s.l.Warn().Msgf(format, v...) }
func (s serverLogger) Fatalf(format string, v ...any)  { s.l.Error().Msgf(format, v...) }
func (s serverLogger) Errorf(format string, v ...any)  { s.l.Error().Msgf(format, v...) }
func (s serverLogger) Debugf(format string, v ...any)  { s.l.Debug().Msgf(format, v...) }
func (s serverLogger) Tracef(format string, v ...any)  { s.l.Trace().Msgf(format, v...) }

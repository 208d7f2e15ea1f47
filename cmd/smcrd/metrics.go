// Metrics: the Prometheus listener at metrics_address. The collector lives in
// package metrics; until it is wired here the listener is not opened.

package main

import (
	"context"
	"log/slog"

	"github.com/smcr-io/smcr/daemon"
)

func serveMetrics(addr string, _ *daemon.Daemon, log *slog.Logger) func(context.Context) {
	if addr != "" {
		log.Debug("metrics listener not built into this smcrd", "address", addr)
	}
	return func(context.Context) {}
}

// Metrics: the Prometheus listener at metrics_address, serving package metrics'
// collector over the daemon's control snapshots at /metrics.

package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/smcr-io/smcr/daemon"
	"github.com/smcr-io/smcr/metrics"
)

// serveMetrics opens the listener (nothing when addr is empty) and returns the
// function that closes it. A listener that cannot open is an error: an smcrd
// that ran without the metrics it was told to serve would look, to the
// monitoring, like one that is down, or go unwatched.
func serveMetrics(addr string, d *daemon.Daemon, log *slog.Logger) (func(context.Context), error) {
	if addr == "" {
		return func(context.Context) {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler(d, log))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics listener", "err", err)
		}
	}()
	log.Info("metrics listening", "address", ln.Addr().String())
	return func(ctx context.Context) { srv.Shutdown(ctx) }, nil
}

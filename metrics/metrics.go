// Package metrics exposes smcrd's counters to Prometheus: the same numbers as
// `smcrctl stats`, plus one series per link group and per link. Not part of
// RFC 7609; the counters follow Linux smc-tools (see package control).
//
// There is one source of truth: the collector reads control API snapshots
// (Backend.Stats, LinkGroups, Status) at scrape time and keeps no counters of its
// own, so a scrape and `smcrctl stats --json` taken together agree, and
// `smcrctl stats -r` resets both (Prometheus sees a counter reset, which rate()
// handles).
//
// Metric names (namespace smcr), labels in braces:
//
//	smcr_up, smcr_enabled, smcr_uptime_seconds, smcr_stats_since_reset_seconds
//	smcr_state{state}
//	smcr_connections_{handled,smcr,fallback,first_contact,reused}_total
//	smcr_connection_fallbacks_total{code,reason,side}
//	smcr_handshake_errors_total, smcr_connections_active
//	smcr_{bytes,requests,fallback_bytes}_total{direction}
//	smcr_buffer_{full,too_small,downgrades,reuses}_total{direction}
//	smcr_buffer_size_total{direction,size}, smcr_request_size_total{direction,size}
//	smcr_memory_in_use_bytes, smcr_memory_peak_bytes
//	smcr_protocol_errors_total, smcr_aborts_total
//	smcr_linkgroup_info{linkgroup,role,peer,peer_addr,provider,state}
//	smcr_linkgroup_connections{linkgroup}, smcr_linkgroup_links{linkgroup},
//	smcr_linkgroup_links_max{linkgroup}
//	smcr_linkgroup_{bytes,work_requests}_total{linkgroup,direction}
//	smcr_link_info{linkgroup,link,interface,device,local_gid,peer_gid,local_qpn,peer_qpn}
//	smcr_link_active{linkgroup,link}, smcr_link_connections{linkgroup,link}
//	smcr_link_{bytes,work_requests}_total{linkgroup,link,direction}
//	smcr_link_errors_total{linkgroup,link}, smcr_link_rtt_seconds{linkgroup,link}
package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/smcr-io/smcr/control"
)

// Source is what the collector reads at scrape time; a control.Backend is one.
type Source interface {
	Status(ctx context.Context) (control.Status, error)
	Stats(ctx context.Context) (control.Stats, error)
	LinkGroups(ctx context.Context) ([]control.LinkGroup, error)
}

// scrapeTimeout bounds the snapshots one scrape takes.
const scrapeTimeout = 5 * time.Second

const ns = "smcr"

// Collector is a prometheus.Collector over a Source.
type Collector struct {
	src Source
	log *slog.Logger
}

// NewCollector returns a collector reading src at each scrape.
func NewCollector(src Source, log *slog.Logger) *Collector {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Collector{src: src, log: log}
}

// Handler serves the collector, with the Go runtime and process collectors, in the
// Prometheus exposition format; smcrd mounts it on metrics_address at /metrics.
func Handler(src Source, log *slog.Logger) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(src, log), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(logOrDiscard(log).Handler(), slog.LevelWarn)})
}

func logOrDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(ns, "", name), help, labels, nil)
}

// scalar is one number of Stats with no labels.
type scalar struct {
	d   *prometheus.Desc
	t   prometheus.ValueType
	get func(control.Stats) float64
}

// directional is one number of a control.Direction, labelled rx or tx.
type directional struct {
	d   *prometheus.Desc
	get func(control.Direction) uint64
}

var (
	upDesc      = desc("up", "1 when smcrd answered the scrape's snapshots, 0 otherwise.")
	enabledDesc = desc("enabled", "1 when matching connections are redirected to SMC-R (smcrctl enable).")
	uptimeDesc  = desc("uptime_seconds", "Seconds since smcrd started.")
	stateDesc   = desc("state", "1 for smcrd's current state (starting, serving, draining), 0 for the others.", "state")

	scalars = []scalar{
		{desc("stats_since_reset_seconds", "Seconds the counters cover (since start or smcrctl stats -r)."), prometheus.GaugeValue,
			func(s control.Stats) float64 { return s.SinceResetSeconds }},
		{desc("connections_handled_total", "Connections that ran or tried the CLC handshake."), prometheus.CounterValue,
			func(s control.Stats) float64 { return float64(s.Connections.Handled) }},
		{desc("connections_smcr_total", "Connections that went SMC-R."), prometheus.CounterValue,
			func(s control.Stats) float64 { return float64(s.Connections.SMCR) }},
		{desc("connections_fallback_total", "Connections that fell back to TCP, all reasons."), prometheus.CounterValue,
			func(s control.Stats) float64 { return float64(s.Connections.Fallback) }},
		{desc("handshake_errors_total", "CLC handshakes that failed (timeouts, malformed messages)."), prometheus.CounterValue,
			func(s control.Stats) float64 { return float64(s.Connections.HandshakeErrors) }},
		{desc("connections_first_contact_total", "SMC-R connections that created a link group."), prometheus.CounterValue,
			func(s control.Stats) float64 { return float64(s.Connections.FirstContact) }},
		{desc("connections_reused_total", "SMC-R connections that reused a link group."), prometheus.CounterValue,
			func(s control.Stats) float64 { return float64(s.Connections.Reused) }},
		{desc("connections_active", "SMC-R connections open now."), prometheus.GaugeValue,
			func(s control.Stats) float64 { return float64(s.Connections.Active) }},
		{desc("memory_in_use_bytes", "Bytes of RMBs and send buffers held now."), prometheus.GaugeValue,
			func(s control.Stats) float64 { return float64(s.MemoryInUse) }},
		{desc("memory_pooled_bytes", "Bytes of buffers the link groups keep for reuse (counted in max_memory too)."), prometheus.GaugeValue,
			func(s control.Stats) float64 { return float64(s.MemoryPooled) }},
		{desc("memory_peak_bytes", "Most bytes of buffers held at once since the last reset."), prometheus.GaugeValue,
			func(s control.Stats) float64 { return float64(s.MemoryPeak) }},
		{desc("protocol_errors_total", "Peer protocol violations (bad cursor, unknown alert token, ...)."), prometheus.CounterValue,
			func(s control.Stats) float64 { return float64(s.ProtocolErrors) }},
		{desc("aborts_total", "Connections ended by an abnormal close."), prometheus.CounterValue,
			func(s control.Stats) float64 { return float64(s.Aborts) }},
		{desc("links_added_total", "Second links added to link groups (ADD_LINK)."), prometheus.CounterValue,
			func(s control.Stats) float64 { return float64(s.Links.Added) }},
		{desc("links_deleted_total", "Links the peer deleted (DELETE_LINK)."), prometheus.CounterValue,
			func(s control.Stats) float64 { return float64(s.Links.Deleted) }},
		{desc("connections_moved_total", "Connections moved to the surviving link after theirs failed."), prometheus.CounterValue,
			func(s control.Stats) float64 { return float64(s.Links.ConnsMoved) }},
		{desc("connections_continued_total", "Connections that went on over TCP when their link group failed."), prometheus.CounterValue,
			func(s control.Stats) float64 { return float64(s.Links.ConnsContinued) }},
	}

	directDesc = desc("direct_connections_total", "Sockets programs brought with the direct mode's library, by outcome: smcr (through shared memory over SMC-R), bypass (of those, library to library on one host), released (of those, handed back to the program's socket mid-stream), tcp (handed back as plain TCP), failed (the connect failed), refused (not taken).", "outcome")

	versionDesc = desc("connections_by_version_total", "SMC-R connections by the SMC-R version their handshake agreed.", "version")

	roleDesc = desc("connections_by_role_total", "Connections handled, that went SMC-R, that fell back to TCP (outcome), by role: client, made by this host's applications, or server, taken by them.", "role", "outcome")

	fallbackDesc = desc("connection_fallbacks_total", "Connections that fell back to TCP, by CLC decline code and the side that declined.", "code", "reason", "side")

	directionals = []directional{
		{desc("bytes_total", "Payload bytes moved over SMC-R.", "direction"), func(d control.Direction) uint64 { return d.Bytes }},
		{desc("requests_total", "Send or receive requests that moved SMC-R payload.", "direction"), func(d control.Direction) uint64 { return d.Requests }},
		{desc("fallback_bytes_total", "Payload bytes over TCP after a fallback.", "direction"), func(d control.Direction) uint64 { return d.FallbackBytes }},
		{desc("buffer_full_total", "Times a writer found the ring buffer full.", "direction"), func(d control.Direction) uint64 { return d.BufferFull }},
		{desc("buffer_too_small_total", "Requests larger than the whole buffer.", "direction"), func(d control.Direction) uint64 { return d.BufferTooSmall }},
		{desc("buffer_downgrades_total", "Buffers smaller than configured, for lack of memory.", "direction"), func(d control.Direction) uint64 { return d.Downgrades }},
		{desc("buffer_reuses_total", "Buffers taken from the free pool instead of allocated.", "direction"), func(d control.Direction) uint64 { return d.Reuses }},
	}

	programDesc = desc("program_events_total", "The eBPF programs' counters: connections redirected or left direct (skip_*), SYNs marked and steered, options sent and echoed.", "event")

	bufferSizeDesc  = desc("buffer_size_total", "Buffers used, by size bucket (upper bound).", "direction", "size")
	requestSizeDesc = desc("request_size_total", "Requests, by payload size bucket (upper bound).", "direction", "size")

	lgInfoDesc  = desc("linkgroup_info", "One series per link group, carrying its identity in labels.", "linkgroup", "role", "peer", "peer_addr", "provider", "state")
	lgConnsDesc = desc("linkgroup_connections", "Connections on the link group now.", "linkgroup")
	lgLinksDesc = desc("linkgroup_links", "Links of the link group now.", "linkgroup")
	lgMostDesc  = desc("linkgroup_links_max", "The most links the link group has had at once; fewer active is a path lost.", "linkgroup")
	lgBytesDesc = desc("linkgroup_bytes_total", "Bytes over every link the link group has had.", "linkgroup", "direction")
	lgWRDesc    = desc("linkgroup_work_requests_total", "Work requests over every link the link group has had.", "linkgroup", "direction")

	linkLabels     = []string{"linkgroup", "link"}
	linkInfoDesc   = desc("link_info", "One series per link, carrying its identity in labels.", "linkgroup", "link", "interface", "device", "local_gid", "peer_gid", "local_qpn", "peer_qpn")
	linkActiveDesc = desc("link_active", "1 when the link is active.", linkLabels...)
	linkConnsDesc  = desc("link_connections", "Connections using the link now.", linkLabels...)
	linkBytesDesc  = desc("link_bytes_total", "Bytes over the link.", "linkgroup", "link", "direction")
	linkWRDesc     = desc("link_work_requests_total", "Work requests over the link: tx those posted (RDMA WRITEs and SENDs), rx the messages received (the peer's SENDs).", "linkgroup", "link", "direction")
	linkErrDesc    = desc("link_errors_total", "Failed work completions and remote access errors on the link.", linkLabels...)
	linkRTTDesc    = desc("link_rtt_seconds", "Last TEST_LINK round trip of the link (absent before the first).", linkLabels...)
)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{upDesc, enabledDesc, uptimeDesc, stateDesc, roleDesc, directDesc, versionDesc, fallbackDesc, programDesc, bufferSizeDesc, requestSizeDesc,
		lgInfoDesc, lgConnsDesc, lgLinksDesc, lgMostDesc, lgBytesDesc, lgWRDesc,
		linkInfoDesc, linkActiveDesc, linkConnsDesc, linkBytesDesc, linkWRDesc, linkErrDesc, linkRTTDesc} {
		ch <- d
	}
	for _, s := range scalars {
		ch <- s.d
	}
	for _, d := range directionals {
		ch <- d.d
	}
}

// Collect implements prometheus.Collector: one snapshot of each kind per scrape.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	st, err1 := c.src.Status(ctx)
	s, err2 := c.src.Stats(ctx)
	lgs, err3 := c.src.LinkGroups(ctx)
	for _, err := range []error{err1, err2, err3} {
		if err != nil {
			// A partial scrape would look like counter resets; report down instead.
			c.log.Warn("metrics snapshot failed", "err", err)
			ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, 0)
			return
		}
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(upDesc, 1)
	gauge(enabledDesc, b2f(st.Enabled))
	gauge(uptimeDesc, st.UptimeSeconds)
	for _, state := range []string{control.StateStarting, control.StateServing, control.StateDraining} {
		gauge(stateDesc, b2f(st.State == state), state)
	}

	for _, m := range scalars {
		ch <- prometheus.MustNewConstMetric(m.d, m.t, m.get(s))
	}
	for role, r := range map[string]control.RoleCounts{"client": s.Connections.Client, "server": s.Connections.Server} {
		counter(roleDesc, r.Handled, role, "handled")
		counter(roleDesc, r.SMCR, role, "smcr")
		counter(roleDesc, r.Fallback, role, "fallback")
	}
	for event, n := range s.Programs {
		counter(programDesc, n, event)
	}
	d := s.Direct
	for outcome, n := range map[string]uint64{"smcr": d.SMCR, "bypass": d.Bypass, "released": d.Released, "tcp": d.TCP, "failed": d.Failed, "refused": d.Refused} {
		counter(directDesc, n, outcome)
	}
	counter(versionDesc, s.Connections.V1, "v1")
	counter(versionDesc, s.Connections.V2, "v2")
	// The same reason may be listed twice if a backend splits it; sum per label set
	// so the registry never sees a duplicate series.
	type fbKey struct{ code, reason, side string }
	fb := map[fbKey]uint64{}
	var order []fbKey
	for _, f := range s.Fallbacks {
		k := fbKey{fmt.Sprintf("0x%08x", f.Code), f.Reason, f.Side}
		if _, ok := fb[k]; !ok {
			order = append(order, k)
		}
		fb[k] += f.Count
	}
	for _, k := range order {
		counter(fallbackDesc, fb[k], k.code, k.reason, k.side)
	}
	for _, dir := range []struct {
		name string
		d    control.Direction
	}{{"rx", s.RX}, {"tx", s.TX}} {
		for _, m := range directionals {
			counter(m.d, m.get(dir.d), dir.name)
		}
		for i, b := range dir.d.BufferSizes {
			counter(bufferSizeDesc, b.Count, dir.name, dir.d.BufferSizes.Label(i))
		}
		for i, b := range dir.d.RequestSizes {
			counter(requestSizeDesc, b.Count, dir.name, dir.d.RequestSizes.Label(i))
		}
	}

	for _, lg := range lgs {
		id := strconv.FormatUint(uint64(lg.ID), 10)
		gauge(lgInfoDesc, 1, id, lg.Role, lg.Peer, lg.PeerAddr, lg.Provider, lg.State)
		gauge(lgConnsDesc, float64(lg.Conns), id)
		gauge(lgLinksDesc, float64(len(lg.Links)), id)
		gauge(lgMostDesc, float64(lg.MostLinks), id)
		for _, l := range lg.Links {
			n := strconv.Itoa(int(l.Num))
			gauge(linkInfoDesc, 1, id, n, l.Interface, l.Device, l.LocalGID, l.PeerGID,
				fmt.Sprintf("%#06x", l.LocalQPN), fmt.Sprintf("%#06x", l.PeerQPN))
			gauge(linkActiveDesc, b2f(l.State == "active"), id, n)
			gauge(linkConnsDesc, float64(l.Conns), id, n)
			counter(linkBytesDesc, l.TX.Bytes, id, n, "tx")
			counter(linkBytesDesc, l.RX.Bytes, id, n, "rx")
			counter(linkWRDesc, l.TX.WorkRequests, id, n, "tx")
			counter(linkWRDesc, l.RX.WorkRequests, id, n, "rx")
			counter(linkErrDesc, l.Errors, id, n)
			if l.RTTMicros > 0 {
				gauge(linkRTTDesc, l.RTTMicros/1e6, id, n)
			}
		}
		counter(lgBytesDesc, lg.TX.Bytes, id, "tx")
		counter(lgBytesDesc, lg.RX.Bytes, id, "rx")
		counter(lgWRDesc, lg.TX.WorkRequests, id, "tx")
		counter(lgWRDesc, lg.RX.WorkRequests, id, "rx")
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

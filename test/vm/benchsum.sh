#!/usr/bin/env bash
# Summarizes the output of bench.sh (stdin, or the files named): for each provider
# benchmark, the median over the rounds beside the median of the perftest tool of
# the same shape, and their ratio (provider / perftest: below 1 is faster for
# latency, slower for throughput). Latencies are medians of one-way times
# (perftest's t_typical, the provider's us-median); throughput is MiB/s (perftest's
# MB is 2^20 bytes). Sleeping on completions (wait-wait) is compared with
# ib_send_lat -e, which sleeps on CQ events too, and the "-inline" ping-pongs with
# ib_send_lat -I and ib_write_lat -I. A benchmark name ends in -N when it
# ran with GOMAXPROCS=N > 1; "proc-" ones ran the responder in a child process.
# The last rows are what a poll of an empty CQ costs (ns: one cgo crossing and
# the provider's bookkeeping), and two engines' 64 B round trip over rxe beside
# TCP's (p50, µs).
#
#	test/vm/benchsum.sh [bench.sh output...]
set -euo pipefail
awk '
function med(list,   n, a, i, j, t) {
	n = split(list, a, " ")
	if (n == 0) return ""
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
function add(key, v) { vals[key] = vals[key] " " v; if (!(key in seen)) { seen[key] = 1; order[++nk] = key } }
{ gsub(/\r/, "") }
# bench.sh names each perftest run ("-- ib_send_lat -e -s 8 ...") before its rows.
/^-- ib_/ { tool = "perftest " $2 ($3 == "-e" ? " -e" : "") ($3 == "-I" ? " -I" : ""); next }
/BW average/ { col = 4; next }
/t_typical/ { col = 5; next }
tool != "" && col && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ { add(tool, $col); tool = ""; col = 0; next }
/^BenchmarkPollEmpty/ {
	for (i = 2; i < NF; i++) if ($(i+1) == "ns/poll") add("poll", $i)
	next
}
/^BenchmarkRoundTrip/ {
	for (i = 2; i < NF; i++) if ($(i+1) == "us-p50-smcr") add("engine smcr", $i); else if ($(i+1) == "us-p50-tcp") add("engine tcp", $i)
	next
}
/^Benchmark/ {
	name = $1; base = name; sub(/-[0-9]+$/, "", base); sub(/\/proc-/, "/", base)
	ref_of[name] = base
	for (i = 2; i < NF; i++) if ($(i+1) == "MiB/s" || $(i+1) == "us-median") add(name, $i)
}
END {
	ref["BenchmarkWrite/spin"] = "perftest ib_write_bw"
	ref["BenchmarkWrite/wait"] = "perftest ib_write_bw"
	ref["BenchmarkSendPingPong/spin-spin"] = "perftest ib_send_lat"
	ref["BenchmarkSendPingPong/spin-wait"] = "perftest ib_send_lat"
	ref["BenchmarkSendPingPong/wait-wait"] = "perftest ib_send_lat -e"
	ref["BenchmarkWritePingPong/spin-spin"] = "perftest ib_write_lat"
	ref["BenchmarkSendPingPong/spin-spin-inline"] = "perftest ib_send_lat -I"
	ref["BenchmarkWritePingPong/spin-spin-inline"] = "perftest ib_write_lat -I"
	printf "%-38s %10s  %-24s %10s %7s  rounds\n", "provider benchmark", "median", "beside", "median", "ratio"
	for (k = 1; k <= nk; k++) {
		key = order[k]
		if (!(key in ref_of) || !(ref_of[key] in ref)) continue
		rk = ref[ref_of[key]]
		m = med(vals[key]); r = med(vals[rk])
		printf "%-38s %10s  %-24s %10s %7s  %s |%s\n", key, m, rk, r, (r + 0 > 0 ? sprintf("%.2f", m / r) : "-"), vals[key], vals[rk]
	}
	if ("poll" in vals)
		printf "%-38s %10s  %-24s %10s %7s  %s\n", "empty poll, ns (one cgo crossing)", med(vals["poll"]), "-", "-", "-", vals["poll"]
	if ("engine smcr" in vals) {
		m = med(vals["engine smcr"]); r = med(vals["engine tcp"])
		printf "%-38s %10s  %-24s %10s %7s  %s |%s\n", "engine 64 B p50 (BenchmarkRoundTrip)", m, "TCP in the guest", r,
			(r + 0 > 0 ? sprintf("%.2f", m / r) : "-"), vals["engine smcr"], vals["engine tcp"]
	}
}' "$@"

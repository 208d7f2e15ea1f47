// Package bench is smcr's benchmark suite: one run measures the SMC-R paths beside
// their baselines on the same machine, in the same run, and writes a report
// (markdown, JSON, PNG plots). cmd/smcrbench is its command line; `make bench`
// runs it. It measures RFC 7609's promise: bulk data and small messages moved by
// RDMA WRITE into the peer's RMB (§4) cheaper than over TCP, and connection setup
// that skips link setup when a link group is reused (§3.3, first contact vs. not).
//
// # Scenarios
//
//	memcpy            copy between two buffers: the ceiling of any same-host path
//	tcp-loopback      plain TCP, client and server in one namespace
//	tcp-veth          plain TCP between two namespaces joined by a veth pair
//	smcr-<provider>   package smcr linked into client and server (Dial/Listen), one
//	                  process each, in the two namespaces: the in-process path
//	smcrd-<provider>  unmodified TCP client and server, one smcrd per namespace:
//	                  the transparent path (skipped, with the reason, when smcrd or
//	                  its eBPF programs cannot run here)
//	tcp-veth (smcrd-<provider> phase)
//	                  the same programs as smcrd-<provider>, to a port smcrd does
//	                  not steer: plain TCP beside each smcrd repeat, its baseline
//	direct-<provider> the direct mode: a C peer (test/e2e/testdata/ddbench.c) with
//	                  libsmcr-preload.so on both ends, one smcrd per namespace
//	                  (throughput, CPU per GiB of both cgroups, 64 B round trip)
//	tcp-veth (direct-<provider> phase)
//	                  the same C programs without the library, to a port smcrd
//	                  does not list: the direct rows' baseline
//
// Every scenario but memcpy and the direct rows runs the same workload code (workload.go) in child
// processes: this binary re-executed inside a namespace (peer.go), so each end
// has its own runtime, CPU accounting and memory, as a deployed program would.
// Only the transport under the net.Conn differs.
//
// # Figures
//
// Throughput: one connection, writes of 4 KiB, 64 KiB and 1 MiB, timed until the
// receiver has read the last byte. Latency: request/response of 64 B and 4 KiB,
// p50/p99/p99.9 of the round trips. Setup: connections per second, each dial
// timed until a one-byte answer arrives; for SMC-R both first contact (a fresh
// client engine, so a new link group each time) and link-group reuse. CPU: seconds
// of user+system time per GiB moved, of both ends (and of the smcrds on the
// transparent path), from each process's CPU-time clock in ns. Scale: N concurrent
// connections set up and then all sending at once, with the resident memory each
// connection costs once its buffers have carried data (client and server, and
// the smcrds on the transparent path).
//
// Every figure is the median of Options.Repeats runs, with min and max, and the
// ratio of its median to its baseline's median from the same run (tcp-veth for
// the two-namespace paths, memcpy for the provider ceiling). The smcrd runs come
// after the others, so each smcrd repeat runs beside a direct TCP repeat between
// the same programs, "tcp-veth (smcrd-<provider> phase)", their baseline.
package bench

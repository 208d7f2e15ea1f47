/* smcr's eBPF programs, one object so they share their maps: sockops (the SMC-R TCP
 * option, RFC 7609 3.3), cgroup connect/getpeername/getsockname/getsockopt (the
 * transparent redirect) and tc ingress + sk_lookup (steering on the server host). */
#include "maps.h"
#include "sockops.h"
#include "redirect.h"
#include "steer.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

// Package ibv is the real-RDMA provider of smcr/verbs: RoCE v2, InfiniBand and
// iWARP devices through libibverbs (RFC 7609 §2.1: SMC-R runs over RC queue pairs
// of RoCE adapters). It is the only cgo package of the project.
//
// The provider is built only with the build tag "ibv" (it needs rdma-core's
// libibverbs-dev); without it, Open returns verbs.ErrUnsupported and the rest of
// the project builds anywhere. Device discovery and the interface-to-device mapping
// (Devices, Resolve) read sysfs and are pure Go, so they work in both builds.
//
// How the verbs objects map:
//
//	verbs.Device  ibv_context + one port + one GID index (RoCE v2 preferred),
//	              chosen again when the port's GID table changes; each QP
//	              keeps the GID it was created with
//	verbs.PD      ibv_pd
//	verbs.MR      ibv_mr over an anonymous mmap (outside the Go heap)
//	verbs.CQ      ibv_cq with its own ibv_comp_channel; Wait spins on the CQ,
//	              then arms it and sleeps on the channel fd in the Go netpoller
//	verbs.QP      RC ibv_qp, created in INIT so RECVs can be posted before
//	              Connect moves it to RTR and RTS
//
// Work requests are translated into C structures owned by each QP, so posting
// allocates nothing. Immediate data is converted to network order on the wire and
// back, so a WRITE WITH IMM delivers the same uint32 the sender posted.
//
// The tests need a real verbs stack; the harness in test/vm runs them on soft-RoCE
// (rdma_rxe) inside a qemu VM, since the development machines have no RDMA.
package ibv

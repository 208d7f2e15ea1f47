// Package engine tests two smcr engines exchanging data over real verbs: the ibv
// provider on soft-RoCE (rdma_rxe), so the whole SMC-R path of RFC 7609 (CLC over
// TCP, CONFIRM_LINK, CDC and RDMA WRITEs into the peer's RMBE) runs on a real RC
// queue pair instead of a software provider.
//
// The test is built with the build tag "ibv" and run inside the qemu VM of
// test/vm, whose TestEngineOnSoftRoCE builds it, boots the VM and requires it to
// pass unskipped. Without the tag this package is empty.
package engine

// Package linuxsmc tests SMC-R version 2 against Linux's own in the qemu VM of
// test/vm: first Linux against itself (two AF_SMC programs over soft-RoCE, with a
// User EID and a PNET entry set through generic netlink and test/vm/rxefix
// loaded), which shows what the VM's kernel can do; then the smcr engine (ibv
// provider) against Linux, as server of its client and as client of its server,
// with Linux's smc_diag view of the connections.
//
// The tests are built with the build tags "linuxsmc" and "ibv" and run inside the
// VM by test/vm's TestLinuxSMCv2OnSoftRoCE, which builds rxefix.ko, boots the VM
// and requires them to pass. Without the tags this package is empty.
package linuxsmc

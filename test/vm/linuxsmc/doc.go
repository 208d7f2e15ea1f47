// Package linuxsmc tests Linux's own SMC-R version 2 against itself in the qemu VM
// of test/vm: two AF_SMC programs over soft-RoCE, with a User EID and a PNET entry
// set through generic netlink and test/vm/rxefix loaded. It shows what the VM's
// kernel can do before smcr is tried against it.
//
// The test is built with the build tag "linuxsmc" and run inside the VM by test/vm's
// TestLinuxSMCv2OnSoftRoCE, which builds rxefix.ko, boots the VM and requires it to
// pass. Without the tag this package is empty.
package linuxsmc

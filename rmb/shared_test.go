package rmb

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// TestSharedMatchesC compiles preload/smcr_abi.h and compares its layout with
// this package's: the library and smcrd must agree on every byte.
func TestSharedMatchesC(t *testing.T) {
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc: cannot compile the C side of the ABI")
	}
	dir := t.TempDir()
	src := `#include <stdio.h>
#include <stddef.h>
#include "smcr_abi.h"
#define F(s, f) printf(#f " %zu\n", offsetof(struct s, f))
int main(void) {
	F(smcr_shared, magic); F(smcr_shared, version); F(smcr_shared, tx_size); F(smcr_shared, rx_size);
	F(smcr_shared, tx_off); F(smcr_shared, rx_off); F(smcr_shared, map_size); F(smcr_shared, ring_files);
	F(smcr_shared, tx_prod); F(smcr_shared, rx_cons); F(smcr_shared, lib_flags); F(smcr_shared, lib_seq);
	F(smcr_shared, lib_waiters); F(smcr_shared, lib_pollers); F(smcr_shared, tx_urg); F(smcr_shared, rx_oob);
	F(smcr_shared, lib_owner); F(smcr_shared, lib_sending); F(smcr_shared, lib_pidns);
	F(smcr_shared, tx_cons); F(smcr_shared, rx_prod); F(smcr_shared, d_flags); F(smcr_shared, d_errno);
	F(smcr_shared, d_seq); F(smcr_shared, d_txwait); F(smcr_shared, d_rxwait); F(smcr_shared, rx_urg);
	F(smcr_shared, lib_ring_ops); F(smcr_shared, lib_releasing);
	printf("sizeof_shared %zu\n", sizeof(struct smcr_shared));
	F(smcr_policy, heartbeat_ns); F(smcr_policy, enabled); F(smcr_policy, ports);
	F(smcr_policy, max_memory); F(smcr_policy, mem_used); F(smcr_policy, naddrs); F(smcr_policy, addrs);
	printf("SMCR_POLICY_MAX_ADDRS %d\n", SMCR_POLICY_MAX_ADDRS);
	printf("sizeof_policy %zu\n", sizeof(struct smcr_policy));
	F(smcr_wake, sleepers); F(smcr_wake, pub);
	printf("sizeof_wake %zu\nSMCR_WAKE_SIZE %d\nwake_magic %u\n", sizeof(struct smcr_wake), SMCR_WAKE_SIZE, SMCR_WAKE_MAGIC);
	printf("sizeof_msg %zu\n", sizeof(struct smcr_msg));
	printf("SMCR_RING_FILES %u\n", SMCR_RING_FILES);
	printf("SMCR_LIB_SHUT_WR %u\nSMCR_LIB_CLOSED %u\nSMCR_LIB_ABORT %u\nSMCR_LIB_RELEASE %u\nSMCR_D_EOF %u\nSMCR_D_ERROR %u\nSMCR_D_TX_CLOSED %u\nSMCR_D_RELEASED %u\nSMCR_D_NO_RELEASE %u\nSMCR_D_PEER_RELEASE %u\n",
		SMCR_LIB_SHUT_WR, SMCR_LIB_CLOSED, SMCR_LIB_ABORT, SMCR_LIB_RELEASE, SMCR_D_EOF, SMCR_D_ERROR, SMCR_D_TX_CLOSED, SMCR_D_RELEASED, SMCR_D_NO_RELEASE, SMCR_D_PEER_RELEASE);
	printf("magic %u\npolicy_magic %u\nversion %u\n", SMCR_SHARED_MAGIC, SMCR_POLICY_MAGIC, SMCR_ABI_VERSION);
	return 0;
}
`
	if err := os.WriteFile(filepath.Join(dir, "abi.c"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "abi")
	if out, err := exec.Command(cc, "-std=c11", "-Wall", "-Werror", "-I", "../preload", "-o", bin, filepath.Join(dir, "abi.c")).CombinedOutput(); err != nil {
		t.Fatalf("compile: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{
		"magic": offMagic, "version": offVersion, "tx_size": offTxSize, "rx_size": offRxSize,
		"tx_off": offTxOff, "rx_off": offRxOff, "map_size": offMapSize, "ring_files": offRingFile,
		"tx_prod": offTxProd, "rx_cons": offRxCons, "lib_flags": offLibFlags, "lib_seq": offLibSeq,
		"lib_waiters": offLibWait, "lib_pollers": offLibPoll, "tx_urg": offTxUrg, "rx_oob": offRxOOB,
		"lib_owner": offLibOwner, "lib_sending": offLibSend, "lib_pidns": offLibPidNS,
		"tx_cons": offTxCons, "rx_prod": offRxProd, "d_flags": offDFlags, "d_errno": offDErrno,
		"d_seq": offDSeq, "d_txwait": offDTxWait, "d_rxwait": offDRxWait, "rx_urg": offRxUrg,
		"lib_ring_ops": offLibRingOps, "lib_releasing": offLibReleasing, "sizeof_shared": sharedEnd,
		"heartbeat_ns": 8, "enabled": 16, "ports": 24, "sizeof_policy": PolicySize,
		"max_memory": offPolicyMaxMem, "mem_used": offPolicyMemUse, "naddrs": offPolicyNAddrs, "addrs": offPolicyAddrs,
		"SMCR_POLICY_MAX_ADDRS": PolicyMaxAddrs,
		"sleepers":              offWakeSleepers, "pub": offWakePub, "sizeof_wake": wakeEnd,
		"SMCR_WAKE_SIZE": WakeSize, "wake_magic": WakeMagic,
		"sizeof_msg":       MsgHeaderLen,
		"SMCR_LIB_SHUT_WR": LibShutWR, "SMCR_LIB_CLOSED": LibClosed, "SMCR_LIB_ABORT": LibAbort,
		"SMCR_LIB_RELEASE": LibRelease, "SMCR_D_RELEASED": DReleased, "SMCR_D_NO_RELEASE": DNoRelease, "SMCR_D_PEER_RELEASE": DPeerRelease,
		"SMCR_D_EOF": DEOF, "SMCR_D_ERROR": DError, "SMCR_D_TX_CLOSED": DTxClosed,
		"SMCR_RING_FILES": SharedRingFiles,
		"policy_magic":    PolicyMagic, "version ": ABIVersion,
	}
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(l, " ")
		got[k] = v
	}
	// "magic" names both the field offset and the constant: the constant comes last.
	if got["magic"] != itoa(SharedMagic) {
		t.Errorf("SMCR_SHARED_MAGIC = %s, want %d", got["magic"], SharedMagic)
	}
	delete(want, "magic")
	delete(want, "version ")
	if got["version"] != itoa(ABIVersion) {
		t.Errorf("SMCR_ABI_VERSION = %s, want %d", got["version"], ABIVersion)
	}
	delete(want, "version")
	for k, v := range want {
		if got[k] != itoa(v) {
			t.Errorf("%s: C says %s, Go %d", k, got[k], v)
		}
	}
}

func itoa(v int) string {
	b := []byte{}
	if v == 0 {
		return "0"
	}
	for ; v > 0; v /= 10 {
		b = append([]byte{byte('0' + v%10)}, b...)
	}
	return string(b)
}

func TestSharedRoundTrip(t *testing.T) {
	mem := make([]uint64, SharedSize(5000, 3000)/8)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&mem[0])), len(mem)*8)
	s, err := InitShared(b, 5000, 3000)
	if err != nil {
		t.Fatal(err)
	}
	v, err := ViewShared(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.TxRing()) != 5000 || len(v.RxRing()) != 3000 {
		t.Fatalf("rings %d, %d", len(v.TxRing()), len(v.RxRing()))
	}
	if &v.RxRing()[0] != &b[SharedPageSize+8192] {
		t.Fatal("receive ring not after the send ring's pages")
	}
	s.TxProd().Store(7)
	if v.TxProd().Load() != 7 {
		t.Fatal("views disagree")
	}
	b[offMagic] ^= 1
	if _, err := ViewShared(b); err == nil {
		t.Fatal("bad magic accepted")
	}
	b[offMagic] ^= 1
	s.u32(offTxSize).Store(1 << 30)
	if _, err := ViewShared(b); err == nil {
		t.Fatal("a ring past the mapping accepted")
	}
}

// TestSharedRingFiles: an area whose rings are in files of their own is the
// control page alone; its view has the rings only once they are attached, at
// the offsets its header gives.
func TestSharedRingFiles(t *testing.T) {
	page := make([]uint64, SharedPageSize/8)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&page[0])), SharedPageSize)
	tx, rx := make([]byte, 5000), make([]byte, 3000)
	if _, err := InitSharedRingFiles(b, tx, rx, 0, 1<<33); err == nil {
		t.Fatal("an offset past 32 bits accepted")
	}
	s, err := InitSharedRingFiles(b, tx, rx, 8192, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if &s.TxRing()[0] != &tx[0] || &s.RxRing()[0] != &rx[0] {
		t.Fatal("smcrd's view lost its rings")
	}
	v, err := ViewShared(b)
	if err != nil {
		t.Fatal(err)
	}
	txOff, rxOff, ok := v.RingFiles()
	if !ok || txOff != 8192 || rxOff != 4096 || v.TxRing() != nil {
		t.Fatalf("ring files %d %d %v, rings %d bytes", txOff, rxOff, ok, len(v.TxRing()))
	}
	if err := v.AttachRings(tx[:4000], rx); err == nil {
		t.Fatal("a send ring of the wrong size attached")
	}
	if err := v.AttachRings(tx, rx); err != nil || &v.RxRing()[0] != &rx[0] {
		t.Fatalf("attach: %v", err)
	}
	s.u32(offRingFile).Store(2)
	if _, err := ViewShared(b); err == nil {
		t.Fatal("an unknown ring placement accepted")
	}
	s.u32(offRingFile).Store(SharedRingFiles)
	s.u32(offMapSize).Store(2 * SharedPageSize)
	if _, err := ViewShared(b); err == nil {
		t.Fatal("a control page of the wrong size accepted")
	}
	if _, _, ok := mustView(t, 5000, 3000).RingFiles(); ok {
		t.Fatal("an area with its own rings says they are in files")
	}
}

func mustView(t *testing.T, tx, rx int) *Shared {
	t.Helper()
	mem := make([]uint64, SharedSize(tx, rx)/8)
	s, err := InitShared(unsafe.Slice((*byte)(unsafe.Pointer(&mem[0])), len(mem)*8), tx, rx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPolicyPorts(t *testing.T) {
	mem := make([]uint64, PolicySize/8)
	p, err := InitPolicy(unsafe.Slice((*byte)(unsafe.Pointer(&mem[0])), PolicySize))
	if err != nil {
		t.Fatal(err)
	}
	p.SetPorts(func(port uint16) bool { return port == 5201 || port == 65535 || port == 0 })
	for port, want := range map[uint16]bool{0: true, 1: false, 5201: true, 5202: false, 65535: true} {
		if p.Port(port) != want {
			t.Errorf("port %d: %v", port, !want)
		}
	}
	p.SetEnabled(true)
	p.Beat(42)
	if !p.Enabled() || p.Heartbeat() != 42 {
		t.Fatal("enabled or heartbeat lost")
	}
}

func TestPolicyAddrsAndMemory(t *testing.T) {
	mem := make([]uint64, PolicySize/8)
	p, err := InitPolicy(unsafe.Slice((*byte)(unsafe.Pointer(&mem[0])), PolicySize))
	if err != nil {
		t.Fatal(err)
	}
	addrs := []netip.Addr{netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("2001:db8::1")}
	p.SetAddrs(addrs)
	if got := p.Addrs(); !slices.Equal(got, addrs) {
		t.Errorf("addrs %v, want %v", got, addrs)
	}
	// Too many to list: any address.
	p.SetAddrs(make([]netip.Addr, PolicyMaxAddrs+1))
	if got := p.Addrs(); got != nil {
		t.Errorf("addrs %v after an overlong list, want none (any)", got)
	}
	p.SetMemory(100, 200)
	if used, limit := p.Memory(); used != 100 || limit != 200 {
		t.Errorf("memory %d of %d", used, limit)
	}
}

// TestWakePublished: a publish says to write the eventfd only while a thread
// sleeps, and counts itself either way.
func TestWakePublished(t *testing.T) {
	mem := make([]uint64, WakeSize/8)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&mem[0])), WakeSize)
	if _, err := ViewWake(b); err == nil {
		t.Fatal("a page without its magic viewed")
	}
	if _, err := InitWake(b); err != nil {
		t.Fatal(err)
	}
	w, err := ViewWake(b)
	if err != nil {
		t.Fatal(err)
	}
	if w.Published() {
		t.Error("publish with no sleeper asks for a wake")
	}
	w.Sleepers().Add(1)
	if !w.Published() {
		t.Error("publish with a sleeper asks for no wake")
	}
	if got := w.Pub().Load(); got != 2 {
		t.Errorf("pub %d after two publishes", got)
	}
}

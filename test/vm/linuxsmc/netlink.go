//go:build linuxsmc

// The generic-netlink calls that configure Linux's SMC for version 2 (what
// smc-tools' smc_ueid and smc_pnet do; smc-tools is not in Debian): a User EID,
// and a PNET entry tying an interface to an RDMA device port.

package linuxsmc

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Linux's include/uapi/linux/smc.h.
const (
	smcGenlFamily    = "SMC_GEN_NETLINK"
	smcCmdAddUEID    = 10 // SMC_NETLINK_ADD_UEID
	smcAttrEIDEntry  = 1  // SMC_NLA_EID_TABLE_ENTRY: 32 blank-padded bytes and a NUL
	pnetGenlFamily   = "SMC_PNETID"
	pnetCmdAdd       = 2 // SMC_PNETID_ADD
	pnetAttrName     = 1 // SMC_PNETID_NAME
	pnetAttrEthName  = 2 // SMC_PNETID_ETHNAME
	pnetAttrIBName   = 3 // SMC_PNETID_IBNAME
	pnetAttrIBPort   = 4 // SMC_PNETID_IBPORT, u8
	smcGenlVersion   = 1
	smcEIDAttrLength = 33
)

// genl sends one generic-netlink command of family to the kernel and waits for
// its acknowledgement.
func genl(family string, cmd uint8, attrs ...*nl.RtAttr) error {
	f, err := netlink.GenlFamilyGet(family)
	if err != nil {
		return fmt.Errorf("genl family %s: %w", family, err)
	}
	req := nl.NewNetlinkRequest(int(f.ID), unix.NLM_F_ACK)
	req.AddData(&nl.Genlmsg{Command: cmd, Version: smcGenlVersion})
	for _, a := range attrs {
		req.AddData(a)
	}
	if _, err := req.Execute(unix.NETLINK_GENERIC, 0); err != nil {
		return fmt.Errorf("genl %s command %d: %w", family, cmd, err)
	}
	return nil
}

// addUEID adds a User EID (already padded to 32 bytes) to the kernel's table,
// which is global, not per network namespace.
func addUEID(eid [32]byte) error {
	v := make([]byte, smcEIDAttrLength)
	copy(v, eid[:])
	return genl(smcGenlFamily, smcCmdAddUEID, nl.NewRtAttr(smcAttrEIDEntry, v))
}

// addPNET ties netdev to port of RDMA device ib under pnetid: 6.1's rxe reports
// no netdev of its own, and without the entry SMC finds no device for the
// connection (Decline 0x03030000). The IB half is honoured in init_net only.
func addPNET(pnetid, netdev, ib string, port uint8) error {
	return genl(pnetGenlFamily, pnetCmdAdd,
		nl.NewRtAttr(pnetAttrName, nl.ZeroTerminated(pnetid)),
		nl.NewRtAttr(pnetAttrEthName, nl.ZeroTerminated(netdev)),
		nl.NewRtAttr(pnetAttrIBName, nl.ZeroTerminated(ib)),
		nl.NewRtAttr(pnetAttrIBPort, []byte{port}))
}

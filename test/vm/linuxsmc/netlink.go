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

// Linux's include/uapi/linux/smc_diag.h: the sock_diag view smcss prints.
const (
	smcDiagModeSMCR   = 0  // SMC_DIAG_MODE_SMCR
	smcDiagLGRInfo    = 2  // SMC_DIAG_LGRINFO, asked for by bit 1 << (2-1)
	smcDiagFallback   = 5  // SMC_DIAG_FALLBACK: reason, peer diagnosis (u32 each), always sent
	smcDiagMsgLen     = 64 // struct smc_diag_msg: family .. sockid, uid, inode
	smcDiagIDOff      = 4  // struct inet_diag_sockid
	smcDiagLinkIBName = 1
	smcDiagLinkGID    = 1 + 64 + 1
	smcDiagLinkPeer   = smcDiagLinkGID + 40
	smcDiagRole       = smcDiagLinkPeer + 40
	ibNameLen         = 64
	gidTextLen        = 40
)

// smcDiag is one AF_SMC socket as Linux's smc_diag reports it (smcss's line).
type smcDiag struct {
	SPort, DPort uint16
	Mode         uint8  // smcDiagModeSMCR, 1 fallback, 2 SMC-D
	State        uint8  // the socket's state (SMC_ACTIVE = 1, ...)
	FallbackCode uint32 // the decline code that made it fall back, if it did
	IBDevice     string // from SMC_DIAG_LGRINFO, for SMC-R sockets
	GID, PeerGID string // its link's local and peer GIDs, as Linux prints them
	Role         uint8  // 0 client, 1 server
}

// smcSockets lists the AF_SMC sockets of IPv4 (smc_proto) with their link
// group's first link, through sock_diag as smcss asks for them.
func smcSockets() ([]smcDiag, error) {
	req := nl.NewNetlinkRequest(unix.SOCK_DIAG_BY_FAMILY, unix.NLM_F_DUMP)
	body := make([]byte, 4+48) // struct smc_diag_req: family, pad (2), ext, sockid
	body[0] = unix.AF_SMC
	body[3] = 1 << (smcDiagLGRInfo - 1)
	req.AddRawData(body)
	msgs, err := req.Execute(unix.NETLINK_SOCK_DIAG, 0)
	if err != nil {
		return nil, fmt.Errorf("smc_diag dump: %w", err)
	}
	var out []smcDiag
	for _, m := range msgs {
		if len(m) < smcDiagMsgLen {
			return nil, fmt.Errorf("smc_diag: message of %d bytes", len(m))
		}
		d := smcDiag{
			State: m[1], Mode: m[2],
			SPort: uint16(m[smcDiagIDOff])<<8 | uint16(m[smcDiagIDOff+1]),
			DPort: uint16(m[smcDiagIDOff+2])<<8 | uint16(m[smcDiagIDOff+3]),
		}
		for b := m[smcDiagMsgLen:]; len(b) >= 4; {
			n, typ := int(nl.NativeEndian().Uint16(b)), nl.NativeEndian().Uint16(b[2:])
			if n < 4 || n > len(b) {
				return nil, fmt.Errorf("smc_diag: attribute of %d bytes in %d", n, len(b))
			}
			v := b[4:n]
			b = b[min((n+3)&^3, len(b)):]
			if typ == smcDiagFallback && len(v) >= 4 {
				d.FallbackCode = nl.NativeEndian().Uint32(v)
			}
			if typ != smcDiagLGRInfo || len(v) <= smcDiagRole {
				continue
			}
			d.IBDevice = cString(v[smcDiagLinkIBName : smcDiagLinkIBName+ibNameLen])
			d.GID = cString(v[smcDiagLinkGID : smcDiagLinkGID+gidTextLen])
			d.PeerGID = cString(v[smcDiagLinkPeer : smcDiagLinkPeer+gidTextLen])
			d.Role = v[smcDiagRole]
		}
		out = append(out, d)
	}
	return out, nil
}

func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

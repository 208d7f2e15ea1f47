// The direct socket's messages (struct smcr_msg): one per SOCK_SEQPACKET packet
// between libsmcr-preload.so and smcrd, in host byte order, file descriptors
// beside them as SCM_RIGHTS. docs/direct.md tells the exchange.
//
//	offset  field
//	     0  magic "SMCD" u32
//	     4  version u16, type u16
//	     8  status i32 (0 or a negative errno)
//	    12  mode u32 (DECIDED)
//	    16  len u32: payload bytes after the header
//	    20  reserved u32
//	    24  payload

package rmb

import (
	"encoding/binary"
	"errors"
	"fmt"
)

const (
	MsgMagic      = 0x44434d53 // "SMCD"
	MsgHeaderLen  = 24
	MsgMaxPayload = 65536
)

// MsgType is a message's type.
type MsgType uint16

const (
	MsgClient     MsgType = 1  // library: fds, a TCP socket about to connect and the process's eventfd
	MsgConnecting MsgType = 2  // library: connect() was called
	MsgListener   MsgType = 3  // library: fd, a TCP socket about to listen
	MsgAccepted   MsgType = 4  // library: fds, a socket accepted from a registered listener and the process's eventfd
	MsgReply      MsgType = 16 // smcrd: status 0 (go on) or a negative errno
	MsgDecided    MsgType = 17 // smcrd: the connection's mode
)

// Mode is what a DECIDED message decided.
type Mode uint32

const (
	// ModeSMCR: fds the shared area's memfd, efd_dtx, efd_drx; then, where the
	// area says SharedRingFiles, the send ring's file and the receive ring's.
	ModeSMCR   Mode = 1
	ModeTCP    Mode = 2 // plain TCP; the payload comes first
	ModeFailed Mode = 3 // the connect failed: Status is its negative errno
	// ModeSHM: as ModeSMCR, and the peer is a library on this host too: fds
	// memfd, efd_dtx, efd_drx, then the peer's memfd and its process's eventfd.
	// The library writes into the peer's receive ring itself (docs/direct.md).
	ModeSHM Mode = 4
)

// Msg is one message's header.
type Msg struct {
	Type   MsgType
	Status int32
	Mode   Mode
}

var le = binary.LittleEndian // the hosts smcr runs on; C writes host order

// Append appends m with payload p.
func (m Msg) Append(b, p []byte) []byte {
	b = le.AppendUint32(b, MsgMagic)
	b = le.AppendUint16(b, ABIVersion)
	b = le.AppendUint16(b, uint16(m.Type))
	b = le.AppendUint32(b, uint32(m.Status))
	b = le.AppendUint32(b, uint32(m.Mode))
	b = le.AppendUint32(b, uint32(len(p)))
	b = le.AppendUint32(b, 0)
	return append(b, p...)
}

// ParseMsg parses one packet: its header, and its payload, which aliases b.
func ParseMsg(b []byte) (Msg, []byte, error) {
	if len(b) < MsgHeaderLen {
		return Msg{}, nil, errors.New("rmb: direct message: short")
	}
	if le.Uint32(b) != MsgMagic {
		return Msg{}, nil, errors.New("rmb: direct message: bad magic")
	}
	if v := le.Uint16(b[4:]); v != ABIVersion {
		return Msg{}, nil, fmt.Errorf("rmb: direct message: version %d, want %d", v, ABIVersion)
	}
	m := Msg{Type: MsgType(le.Uint16(b[6:])), Status: int32(le.Uint32(b[8:])), Mode: Mode(le.Uint32(b[12:]))}
	n := le.Uint32(b[16:])
	if le.Uint32(b[20:]) != 0 {
		return Msg{}, nil, errors.New("rmb: direct message: reserved bytes set")
	}
	if n > MsgMaxPayload || int(n) != len(b)-MsgHeaderLen {
		return Msg{}, nil, fmt.Errorf("rmb: direct message: payload of %d bytes in a packet of %d", n, len(b))
	}
	switch m.Type {
	case MsgClient, MsgConnecting, MsgListener, MsgAccepted:
	case MsgReply:
	case MsgDecided:
		if m.Mode < ModeSMCR || m.Mode > ModeSHM {
			return Msg{}, nil, fmt.Errorf("rmb: direct message: mode %d", m.Mode)
		}
	default:
		return Msg{}, nil, fmt.Errorf("rmb: direct message: type %d", m.Type)
	}
	return m, b[MsgHeaderLen:], nil
}

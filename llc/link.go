// Link messages: CONFIRM_LINK, ADD_LINK, ADD_LINK_CONT, DELETE_LINK and TEST_LINK.
// Implements RFC 7609 §3.8 / §4.7 (link setup, failover, keepalive messages).

package llc

import (
	"fmt"
)

// CONFIRM_LINK body offsets (struct smc_llc_msg_confirm_link).
const (
	clMAC      = 4
	clGID      = 10
	clQPN      = 26
	clLink     = 29
	clUID      = 30
	clMaxLinks = 34
	// 35..43 reserved
)

// ConfirmLink (type 0x01) confirms a new link: the server sends it on the new QP,
// the client answers with its own values and FlagResponse.
type ConfirmLink struct {
	Flags    Flags // FlagResponse, FlagNoRMBEyecatcher
	MAC      MAC   // sender's RoCE port MAC
	GID      GID   // sender's GID
	QPN      QPN   // sender's QP number
	Link     LinkID
	LinkUID  LinkUID
	MaxLinks uint8 // most links the sender wants in the group (Linux: 2)
}

func (*ConfirmLink) Type() Type       { return TypeConfirmLink }
func (m *ConfirmLink) Response() bool { return m.Flags.Response() }

// NoRMBEyecatcher reports whether the sender declares RMBEs without eyecatchers
// (either of the two flag bits; Linux sets both and rejects a link with neither).
func (m *ConfirmLink) NoRMBEyecatcher() bool { return m.Flags&FlagNoRMBEyecatcher != 0 }

func (m *ConfirmLink) Decode(b []byte) error {
	if err := checkFrame(b, TypeConfirmLink); err != nil {
		return err
	}
	*m = ConfirmLink{
		Flags:    Flags(b[offFlags]),
		MAC:      MAC(b[clMAC : clMAC+6]),
		GID:      GID(b[clGID : clGID+16]),
		QPN:      QPN(get24(b[clQPN:])),
		Link:     LinkID(b[clLink]),
		LinkUID:  LinkUID(b[clUID : clUID+4]),
		MaxLinks: b[clMaxLinks],
	}
	return nil
}

func (m *ConfirmLink) Encode(dst []byte) error {
	if err := checkDst(dst, TypeConfirmLink); err != nil {
		return err
	}
	if m.QPN > maxU24 {
		return fmt.Errorf("llc: encode CONFIRM_LINK: %w: QPN %#x over 24 bits", ErrField, uint32(m.QPN))
	}
	header(dst, TypeConfirmLink, 0, m.Flags)
	copy(dst[clMAC:], m.MAC[:])
	copy(dst[clGID:], m.GID[:])
	put24(dst[clQPN:], uint32(m.QPN))
	dst[clLink] = byte(m.Link)
	copy(dst[clUID:], m.LinkUID[:])
	dst[clMaxLinks] = m.MaxLinks
	return nil
}

func (m *ConfirmLink) AppendBinary(b []byte) ([]byte, error) { return appendMsg(b, m) }

// ADD_LINK body offsets (struct smc_llc_msg_add_link).
const (
	alMAC = 4
	// 10..11 reserved
	alGID  = 12
	alQPN  = 28
	alLink = 31
	alMTU  = 32 // low nibble; high nibble reserved
	alPSN  = 33
	// 36..43 reserved
)

// RejectReason says why an ADD_LINK response refuses the link (header byte 2, low
// nibble; with FlagAddLinkRejected).
type RejectReason uint8

const (
	RejectNoAltPath  RejectReason = 1 // no alternate path available (the one Linux sends)
	RejectInvalidMTU RejectReason = 2 // the MTU in the request is not acceptable
)

func (r RejectReason) String() string {
	switch r {
	case 0:
		return "none"
	case RejectNoAltPath:
		return "no alternate path"
	case RejectInvalidMTU:
		return "invalid MTU"
	}
	return fmt.Sprintf("reject reason %d", uint8(r))
}

// AddLink (type 0x02) proposes a new link (server request), answers one (client
// response), or invites the server to propose one (client request, no QP yet).
type AddLink struct {
	Flags        Flags        // FlagResponse, FlagAddLinkRejected
	RejectReason RejectReason // meaningful with FlagAddLinkRejected
	MAC          MAC
	GID          GID
	QPN          QPN
	Link         LinkID
	MTU          MTU // 0 when no QP is offered (invitation, rejection)
	PSN          PSN
}

func (*AddLink) Type() Type       { return TypeAddLink }
func (m *AddLink) Response() bool { return m.Flags.Response() }

// Rejected reports whether the response refuses the link.
func (m *AddLink) Rejected() bool { return m.Flags&FlagAddLinkRejected != 0 }

func (m *AddLink) Decode(b []byte) error {
	if err := checkFrame(b, TypeAddLink); err != nil {
		return err
	}
	mtu := MTU(b[alMTU] & 0x0F)
	if mtu != 0 && !mtu.Valid() {
		return fmt.Errorf("%w: ADD_LINK MTU code %d", ErrMTU, uint8(mtu))
	}
	*m = AddLink{
		Flags:        Flags(b[offFlags]),
		RejectReason: RejectReason(b[offReason] & 0x0F),
		MAC:          MAC(b[alMAC : alMAC+6]),
		GID:          GID(b[alGID : alGID+16]),
		QPN:          QPN(get24(b[alQPN:])),
		Link:         LinkID(b[alLink]),
		MTU:          mtu,
		PSN:          PSN(get24(b[alPSN:])),
	}
	return nil
}

func (m *AddLink) Encode(dst []byte) error {
	if err := checkDst(dst, TypeAddLink); err != nil {
		return err
	}
	switch {
	case m.QPN > maxU24:
		return fmt.Errorf("llc: encode ADD_LINK: %w: QPN %#x over 24 bits", ErrField, uint32(m.QPN))
	case m.PSN > maxU24:
		return fmt.Errorf("llc: encode ADD_LINK: %w: PSN %#x over 24 bits", ErrField, uint32(m.PSN))
	case m.RejectReason > 0x0F:
		return fmt.Errorf("llc: encode ADD_LINK: %w: reject reason %d over 4 bits", ErrField, uint8(m.RejectReason))
	case m.MTU != 0 && !m.MTU.Valid():
		return fmt.Errorf("llc: encode ADD_LINK: %w: code %d", ErrMTU, uint8(m.MTU))
	}
	header(dst, TypeAddLink, uint8(m.RejectReason), m.Flags)
	copy(dst[alMAC:], m.MAC[:])
	copy(dst[alGID:], m.GID[:])
	put24(dst[alQPN:], uint32(m.QPN))
	dst[alLink] = byte(m.Link)
	dst[alMTU] = byte(m.MTU)
	put24(dst[alPSN:], uint32(m.PSN))
	return nil
}

func (m *AddLink) AppendBinary(b []byte) ([]byte, error) { return appendMsg(b, m) }

// ADD_LINK_CONT body offsets (struct smc_llc_msg_add_link_cont).
const (
	alcLink = 4
	alcNum  = 5
	// 6..7 reserved
	alcPairs   = 8
	alcPairLen = 16 // rkey(4) | new rkey(4) | new address(8)
	// 40..43 reserved
)

// AddLinkContPairs is how many {rkey, new rkey, new address} one ADD_LINK_CONT holds.
const AddLinkContPairs = 2

// RkeyPair maps an RMB's rkey on the existing link to its rkey and address on the
// new link (ADD_LINK_CONT).
type RkeyPair struct {
	RKey    uint32 // on the link the message travels on
	NewRKey uint32 // on the link being added
	NewAddr uint64 // on the link being added
}

// AddLinkCont (type 0x03) carries up to two RMBs' rkeys for the link being added.
type AddLinkCont struct {
	Flags     Flags // FlagResponse
	Link      LinkID
	Remaining uint8 // rkeys still to send, counting the ones in this message
	Pairs     [AddLinkContPairs]RkeyPair
}

func (*AddLinkCont) Type() Type       { return TypeAddLinkCont }
func (m *AddLinkCont) Response() bool { return m.Flags.Response() }

// Entries returns the pairs this message carries: min(Remaining, 2) of them.
func (m *AddLinkCont) Entries() []RkeyPair {
	return m.Pairs[:min(int(m.Remaining), AddLinkContPairs)]
}

func (m *AddLinkCont) Decode(b []byte) error {
	if err := checkFrame(b, TypeAddLinkCont); err != nil {
		return err
	}
	*m = AddLinkCont{
		Flags:     Flags(b[offFlags]),
		Link:      LinkID(b[alcLink]),
		Remaining: b[alcNum],
	}
	for i := range m.Pairs {
		p := b[alcPairs+i*alcPairLen:]
		m.Pairs[i] = RkeyPair{RKey: be.Uint32(p), NewRKey: be.Uint32(p[4:]), NewAddr: be.Uint64(p[8:])}
	}
	return nil
}

func (m *AddLinkCont) Encode(dst []byte) error {
	if err := checkDst(dst, TypeAddLinkCont); err != nil {
		return err
	}
	header(dst, TypeAddLinkCont, 0, m.Flags)
	dst[alcLink] = byte(m.Link)
	dst[alcNum] = m.Remaining
	for i, pr := range m.Pairs {
		p := dst[alcPairs+i*alcPairLen:]
		be.PutUint32(p, pr.RKey)
		be.PutUint32(p[4:], pr.NewRKey)
		be.PutUint64(p[8:], pr.NewAddr)
	}
	return nil
}

func (m *AddLinkCont) AppendBinary(b []byte) ([]byte, error) { return appendMsg(b, m) }

// DELETE_LINK body offsets (struct smc_llc_msg_del_link, packed).
const (
	dlLink   = 4
	dlReason = 5 // u32, unaligned
	// 9..43 reserved
)

// DeleteReason is the DELETE_LINK reason code.
type DeleteReason uint32

// DELETE_LINK reason codes (Linux SMC_LLC_DEL_*).
const (
	ReasonLostPath          DeleteReason = 0x00010000 // the link failed
	ReasonOperator          DeleteReason = 0x00020000 // operator initiated termination
	ReasonProgram           DeleteReason = 0x00030000 // program initiated termination (e.g. idle link group)
	ReasonProtocolViolation DeleteReason = 0x00040000 // LLC protocol violation
	ReasonNoAsymNeeded      DeleteReason = 0x00050000 // asymmetric link no longer needed
	ReasonUnknownLink       DeleteReason = 0x00100000 // response: no such link number
	ReasonUnknownLinkGroup  DeleteReason = 0x00200000 // response: no such link group
)

func (r DeleteReason) String() string {
	switch r {
	case 0:
		return "none"
	case ReasonLostPath:
		return "lost path"
	case ReasonOperator:
		return "operator initiated termination"
	case ReasonProgram:
		return "program initiated termination"
	case ReasonProtocolViolation:
		return "LLC protocol violation"
	case ReasonNoAsymNeeded:
		return "asymmetric link no longer needed"
	case ReasonUnknownLink:
		return "unknown link"
	case ReasonUnknownLinkGroup:
		return "unknown link group"
	}
	return fmt.Sprintf("reason %#08x", uint32(r))
}

// DeleteLink (type 0x04) deletes one link, or with FlagDeleteLinkAll every link.
type DeleteLink struct {
	Flags  Flags  // FlagResponse, FlagDeleteLinkAll, FlagDeleteOrderly
	Link   LinkID // the link to delete; Linux sends 0 with FlagDeleteLinkAll
	Reason DeleteReason
}

func (*DeleteLink) Type() Type       { return TypeDeleteLink }
func (m *DeleteLink) Response() bool { return m.Flags.Response() }

// All reports whether every link of the group is to go.
func (m *DeleteLink) All() bool { return m.Flags&FlagDeleteLinkAll != 0 }

// Orderly reports an orderly deletion, as opposed to one after a failure.
func (m *DeleteLink) Orderly() bool { return m.Flags&FlagDeleteOrderly != 0 }

func (m *DeleteLink) Decode(b []byte) error {
	if err := checkFrame(b, TypeDeleteLink); err != nil {
		return err
	}
	*m = DeleteLink{
		Flags:  Flags(b[offFlags]),
		Link:   LinkID(b[dlLink]),
		Reason: DeleteReason(be.Uint32(b[dlReason:])),
	}
	return nil
}

func (m *DeleteLink) Encode(dst []byte) error {
	if err := checkDst(dst, TypeDeleteLink); err != nil {
		return err
	}
	header(dst, TypeDeleteLink, 0, m.Flags)
	dst[dlLink] = byte(m.Link)
	be.PutUint32(dst[dlReason:], uint32(m.Reason))
	return nil
}

func (m *DeleteLink) AppendBinary(b []byte) ([]byte, error) { return appendMsg(b, m) }

// TEST_LINK body offsets (struct smc_llc_msg_test_link).
const (
	tlData = 4
	// 20..43 reserved
)

// TestLinkDataLen is the size of TEST_LINK's user data.
const TestLinkDataLen = 16

// TestLink (type 0x07) is the keepalive: the receiver echoes it with FlagResponse.
type TestLink struct {
	Flags Flags // FlagResponse
	Data  [TestLinkDataLen]byte
}

func (*TestLink) Type() Type       { return TypeTestLink }
func (m *TestLink) Response() bool { return m.Flags.Response() }

func (m *TestLink) Decode(b []byte) error {
	if err := checkFrame(b, TypeTestLink); err != nil {
		return err
	}
	*m = TestLink{Flags: Flags(b[offFlags]), Data: [TestLinkDataLen]byte(b[tlData : tlData+TestLinkDataLen])}
	return nil
}

func (m *TestLink) Encode(dst []byte) error {
	if err := checkDst(dst, TypeTestLink); err != nil {
		return err
	}
	header(dst, TypeTestLink, 0, m.Flags)
	copy(dst[tlData:], m.Data[:])
	return nil
}

func (m *TestLink) AppendBinary(b []byte) ([]byte, error) { return appendMsg(b, m) }

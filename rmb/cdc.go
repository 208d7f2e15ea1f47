// CDC message codec: the 44-byte Connection Data Control message that carries cursors
// and connection-state flags (RFC 7609, CDC message format in Appendix A).

package rmb

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// Wire constants of the CDC message. Offsets are those of Linux struct smc_cdc_msg.
const (
	CDCType = 0xFE // type byte: distinguishes CDC from LLC messages on the same QP
	CDCLen  = 44   // length byte and message size

	offType      = 0
	offLen       = 1
	offSeq       = 2  // u16
	offToken     = 4  // u32
	offProdWrap  = 10 // u16, after 2 reserved bytes at 8
	offProdCount = 12 // u32
	offConsWrap  = 18 // u16, after 2 reserved bytes at 16
	offConsCount = 20 // u32
	offProdFlags = 24
	offConnState = 25
	// 26..43 reserved
)

// ProdFlags is the producer-flags byte of a CDC message.
type ProdFlags uint8

const (
	FlagWriteBlocked       ProdFlags = 0x80 // sender has data but no room in the receiver's RMBE
	FlagUrgentPending      ProdFlags = 0x40 // urgent data announced, not yet written
	FlagUrgentPresent      ProdFlags = 0x20 // urgent data written: last byte before the producer cursor
	FlagUpdateRequested    ProdFlags = 0x10 // receiver must send its consumer cursor now
	FlagFailoverValidation ProdFlags = 0x08 // replayed after a link failover, for validation

	prodFlagsMask = FlagWriteBlocked | FlagUrgentPending | FlagUrgentPresent |
		FlagUpdateRequested | FlagFailoverValidation
)

// ConnState is the connection-state-flags byte of a CDC message.
type ConnState uint8

const (
	StateSendingDone   ConnState = 0x80 // sender shut down writing (shutdown(SHUT_WR))
	StateClosed        ConnState = 0x40 // sender closed the connection
	StateAbnormalClose ConnState = 0x20 // sender aborted (the SMC-R form of a TCP RST)

	connStateMask = StateSendingDone | StateClosed | StateAbnormalClose
)

var prodFlagNames = []struct {
	f    ProdFlags
	name string
}{
	{FlagWriteBlocked, "write-blocked"},
	{FlagUrgentPending, "urgent-pending"},
	{FlagUrgentPresent, "urgent-present"},
	{FlagUpdateRequested, "update-requested"},
	{FlagFailoverValidation, "failover-validation"},
}

var connStateNames = []struct {
	f    ConnState
	name string
}{
	{StateSendingDone, "sending-done"},
	{StateClosed, "closed"},
	{StateAbnormalClose, "abnormal-close"},
}

func (f ProdFlags) String() string {
	var parts []string
	for _, n := range prodFlagNames {
		if f&n.f != 0 {
			parts = append(parts, n.name)
		}
	}
	if rest := f &^ prodFlagsMask; rest != 0 {
		parts = append(parts, fmt.Sprintf("0x%02x", uint8(rest)))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "|")
}

func (s ConnState) String() string {
	var parts []string
	for _, n := range connStateNames {
		if s&n.f != 0 {
			parts = append(parts, n.name)
		}
	}
	if rest := s &^ connStateMask; rest != 0 {
		parts = append(parts, fmt.Sprintf("0x%02x", uint8(rest)))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "|")
}

// Errors returned by ParseCDC, wrapped with the offending value.
var (
	ErrCDCShort  = errors.New("rmb: cdc message too short")
	ErrNotCDC    = errors.New("rmb: not a cdc message")
	ErrCDCLength = errors.New("rmb: bad cdc length byte")
)

// CDC is a decoded Connection Data Control message.
type CDC struct {
	Seq   uint16    // per-connection sequence number, wraps; see SeqBefore
	Token uint32    // alert token of the receiving connection (from its CLC Accept/Confirm)
	Prod  Cursor    // sender's producer cursor in the receiver's RMBE
	Cons  Cursor    // sender's consumer cursor in its own RMBE
	Flags ProdFlags // producer flags
	State ConnState // connection-state flags
}

// Encode writes m into dst[:CDCLen], zeroing the reserved bytes and bits. It does not
// allocate. dst is usually a registered send slot; it must hold CDCLen bytes.
func (m *CDC) Encode(dst []byte) error {
	if len(dst) < CDCLen {
		return fmt.Errorf("rmb: encode cdc: buffer of %d bytes: %w", len(dst), ErrCDCShort)
	}
	b := dst[:CDCLen]
	clear(b)
	b[offType] = CDCType
	b[offLen] = CDCLen
	binary.BigEndian.PutUint16(b[offSeq:], m.Seq)
	binary.BigEndian.PutUint32(b[offToken:], m.Token)
	binary.BigEndian.PutUint16(b[offProdWrap:], m.Prod.Wrap)
	binary.BigEndian.PutUint32(b[offProdCount:], m.Prod.Count)
	binary.BigEndian.PutUint16(b[offConsWrap:], m.Cons.Wrap)
	binary.BigEndian.PutUint32(b[offConsCount:], m.Cons.Count)
	b[offProdFlags] = byte(m.Flags & prodFlagsMask)
	b[offConnState] = byte(m.State & connStateMask)
	return nil
}

// AppendBinary appends the encoded message to b (encoding.BinaryAppender). It does not
// allocate when b has CDCLen bytes of spare capacity.
func (m *CDC) AppendBinary(b []byte) ([]byte, error) {
	n := len(b)
	b = append(b, make([]byte, CDCLen)...)
	return b, m.Encode(b[n:])
}

// MarshalBinary returns the encoded message (encoding.BinaryMarshaler).
func (m *CDC) MarshalBinary() ([]byte, error) { return m.AppendBinary(nil) }

// UnmarshalBinary decodes b into m (encoding.BinaryUnmarshaler); see ParseCDC.
func (m *CDC) UnmarshalBinary(b []byte) error {
	c, err := ParseCDC(b)
	if err != nil {
		return err
	}
	*m = c
	return nil
}

// ParseCDC decodes a CDC message. b must hold at least CDCLen bytes (bytes past
// CDCLen, such as the rest of a 48-byte receive slot, are ignored), start with the CDC
// type and carry the length byte 44. Reserved bytes and bits are ignored. Cursors are
// returned as sent: checking them against the ring is the Producer's and Consumer's
// job. ParseCDC does not allocate on success.
func ParseCDC(b []byte) (CDC, error) {
	if len(b) < CDCLen {
		return CDC{}, fmt.Errorf("rmb: parse cdc: %d bytes: %w", len(b), ErrCDCShort)
	}
	if b[offType] != CDCType {
		return CDC{}, fmt.Errorf("rmb: parse cdc: type 0x%02x: %w", b[offType], ErrNotCDC)
	}
	if b[offLen] != CDCLen {
		return CDC{}, fmt.Errorf("rmb: parse cdc: length %d: %w", b[offLen], ErrCDCLength)
	}
	return CDC{
		Seq:   binary.BigEndian.Uint16(b[offSeq:]),
		Token: binary.BigEndian.Uint32(b[offToken:]),
		Prod: Cursor{
			Wrap:  binary.BigEndian.Uint16(b[offProdWrap:]),
			Count: binary.BigEndian.Uint32(b[offProdCount:]),
		},
		Cons: Cursor{
			Wrap:  binary.BigEndian.Uint16(b[offConsWrap:]),
			Count: binary.BigEndian.Uint32(b[offConsCount:]),
		},
		Flags: ProdFlags(b[offProdFlags]) & prodFlagsMask,
		State: ConnState(b[offConnState]) & connStateMask,
	}, nil
}

// SeqBefore reports whether CDC sequence number a precedes b in 16-bit serial
// arithmetic, as Linux smc_cdc_before: a receiver drops a CDC whose sequence number
// precedes the last one it accepted on the connection.
func SeqBefore(a, b uint16) bool { return int16(a-b) < 0 }

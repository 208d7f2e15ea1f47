// Rkey messages: CONFIRM_RKEY, CONFIRM_RKEY_CONT and DELETE_RKEY, which announce and
// withdraw RMB rkeys on a link group. Implements RFC 7609 §3.8 / §4.7 (rkey messages).

package llc

import "fmt"

// rtoken layout (struct smc_rmb_rtoken, packed): link number or count(1) | rkey(4) |
// address(8).
const (
	rtLen   = 13
	rtRKey  = 1
	rtAddr  = 5
	crFirst = 4 // CONFIRM_RKEY: first rtoken, whose link byte is the count of the others
	crOther = crFirst + rtLen
	// 43 reserved
	crcNum    = 4
	crcTokens = 5 // CONFIRM_RKEY_CONT: 3 rtokens, 5..43
)

// Slot counts of the rkey messages.
const (
	ConfirmRkeyOthers    = 2 // other links' rkeys in one CONFIRM_RKEY
	ConfirmRkeyContSlots = 3 // rkeys in one CONFIRM_RKEY_CONT
	DeleteRkeyMax        = 8 // rkeys in one DELETE_RKEY
)

// RToken is an RMB's rkey and address as seen on one link of the group.
type RToken struct {
	Link LinkID
	RKey uint32
	Addr uint64
}

func getRToken(b []byte) RToken {
	return RToken{Link: LinkID(b[0]), RKey: be.Uint32(b[rtRKey:]), Addr: be.Uint64(b[rtAddr:])}
}

func putRToken(b []byte, t RToken) {
	b[0] = byte(t.Link)
	be.PutUint32(b[rtRKey:], t.RKey)
	be.PutUint64(b[rtAddr:], t.Addr)
}

// ConfirmRkey (type 0x06) announces a new RMB: its rkey and address on the link that
// carries the message, then those on up to two other links of the group.
type ConfirmRkey struct {
	Flags Flags // FlagResponse, FlagRkeyNegative, FlagRkeyRetry
	// NumOthers counts the other links' rkeys: those in Others, then any in
	// CONFIRM_RKEY_CONT messages that follow (never, from Linux).
	NumOthers uint8
	RKey      uint32 // on the link this message travels on
	Addr      uint64 // on the link this message travels on
	Others    [ConfirmRkeyOthers]RToken
}

func (*ConfirmRkey) Type() Type       { return TypeConfirmRkey }
func (m *ConfirmRkey) Response() bool { return m.Flags.Response() }

// Negative reports a response refusing the rkey.
func (m *ConfirmRkey) Negative() bool { return m.Flags&FlagRkeyNegative != 0 }

// Entries returns the other links' tokens present here: min(NumOthers, 2) of them.
func (m *ConfirmRkey) Entries() []RToken {
	return m.Others[:min(int(m.NumOthers), ConfirmRkeyOthers)]
}

func (m *ConfirmRkey) Decode(b []byte) error {
	if err := checkFrame(b, TypeConfirmRkey); err != nil {
		return err
	}
	first := getRToken(b[crFirst:])
	*m = ConfirmRkey{
		Flags:     Flags(b[offFlags]),
		NumOthers: uint8(first.Link),
		RKey:      first.RKey,
		Addr:      first.Addr,
	}
	for i := range m.Others {
		m.Others[i] = getRToken(b[crOther+i*rtLen:])
	}
	return nil
}

func (m *ConfirmRkey) Encode(dst []byte) error {
	if err := checkDst(dst, TypeConfirmRkey); err != nil {
		return err
	}
	header(dst, TypeConfirmRkey, 0, m.Flags)
	putRToken(dst[crFirst:], RToken{Link: LinkID(m.NumOthers), RKey: m.RKey, Addr: m.Addr})
	for i, t := range m.Others {
		putRToken(dst[crOther+i*rtLen:], t)
	}
	return nil
}

func (m *ConfirmRkey) AppendBinary(b []byte) ([]byte, error) { return appendMsg(b, m) }

// ConfirmRkeyCont (type 0x08) continues a CONFIRM_RKEY with up to three more tokens.
type ConfirmRkeyCont struct {
	Flags     Flags // FlagResponse, FlagRkeyNegative, FlagRkeyRetry
	Remaining uint8 // tokens still to confirm, counting the ones in this message
	Tokens    [ConfirmRkeyContSlots]RToken
}

func (*ConfirmRkeyCont) Type() Type       { return TypeConfirmRkeyCont }
func (m *ConfirmRkeyCont) Response() bool { return m.Flags.Response() }

// Entries returns the tokens present here: min(Remaining, 3) of them.
func (m *ConfirmRkeyCont) Entries() []RToken {
	return m.Tokens[:min(int(m.Remaining), ConfirmRkeyContSlots)]
}

func (m *ConfirmRkeyCont) Decode(b []byte) error {
	if err := checkFrame(b, TypeConfirmRkeyCont); err != nil {
		return err
	}
	*m = ConfirmRkeyCont{Flags: Flags(b[offFlags]), Remaining: b[crcNum]}
	for i := range m.Tokens {
		m.Tokens[i] = getRToken(b[crcTokens+i*rtLen:])
	}
	return nil
}

func (m *ConfirmRkeyCont) Encode(dst []byte) error {
	if err := checkDst(dst, TypeConfirmRkeyCont); err != nil {
		return err
	}
	header(dst, TypeConfirmRkeyCont, 0, m.Flags)
	dst[crcNum] = m.Remaining
	for i, t := range m.Tokens {
		putRToken(dst[crcTokens+i*rtLen:], t)
	}
	return nil
}

func (m *ConfirmRkeyCont) AppendBinary(b []byte) ([]byte, error) { return appendMsg(b, m) }

// DELETE_RKEY body offsets (struct smc_llc_msg_delete_rkey).
const (
	drNum  = 4
	drMask = 5
	// 6..7 reserved
	drKeys = 8 // 8 × u32, 8..39
	// 40..43 reserved
)

// DeleteRkey (type 0x09) withdraws up to eight rkeys; a negative response flags in
// ErrMask the ones the receiver did not know.
type DeleteRkey struct {
	Flags   Flags // FlagResponse, FlagRkeyNegative
	Count   uint8 // rkeys in RKeys, 1..8
	ErrMask uint8 // bit 0x80>>i: RKeys[i] was unknown (negative response)
	RKeys   [DeleteRkeyMax]uint32
}

func (*DeleteRkey) Type() Type       { return TypeDeleteRkey }
func (m *DeleteRkey) Response() bool { return m.Flags.Response() }

// Negative reports a response in which some rkeys were unknown.
func (m *DeleteRkey) Negative() bool { return m.Flags&FlagRkeyNegative != 0 }

// Entries returns the Count rkeys of the message. Call it on a validated message
// (from Decode or Parse); it clamps Count to 8 regardless.
func (m *DeleteRkey) Entries() []uint32 { return m.RKeys[:min(int(m.Count), DeleteRkeyMax)] }

// Failed reports whether the response flags RKeys[i] as unknown.
func (m *DeleteRkey) Failed(i int) bool {
	return i >= 0 && i < DeleteRkeyMax && m.ErrMask&(0x80>>i) != 0
}

// SetFailed flags RKeys[i] as unknown (for building a response); i must be < Count.
func (m *DeleteRkey) SetFailed(i int) {
	if i >= 0 && i < DeleteRkeyMax {
		m.ErrMask |= 0x80 >> i
	}
}

// validate checks the count and that the error mask names only present rkeys.
func (m *DeleteRkey) validate() error {
	if m.Count < 1 || m.Count > DeleteRkeyMax {
		return fmt.Errorf("%w: DELETE_RKEY count %d, want 1..%d", ErrCount, m.Count, DeleteRkeyMax)
	}
	// Bits for rkeys i >= Count: 0xFF >> Count.
	if stray := m.ErrMask & (0xFF >> m.Count); stray != 0 {
		return fmt.Errorf("%w: DELETE_RKEY error mask %#02x flags rkeys beyond count %d", ErrCount, m.ErrMask, m.Count)
	}
	return nil
}

func (m *DeleteRkey) Decode(b []byte) error {
	if err := checkFrame(b, TypeDeleteRkey); err != nil {
		return err
	}
	d := DeleteRkey{Flags: Flags(b[offFlags]), Count: b[drNum], ErrMask: b[drMask]}
	if err := d.validate(); err != nil {
		return err
	}
	for i := range d.RKeys {
		d.RKeys[i] = be.Uint32(b[drKeys+4*i:])
	}
	*m = d
	return nil
}

func (m *DeleteRkey) Encode(dst []byte) error {
	if err := checkDst(dst, TypeDeleteRkey); err != nil {
		return err
	}
	if err := m.validate(); err != nil {
		return err
	}
	header(dst, TypeDeleteRkey, 0, m.Flags)
	dst[drNum] = m.Count
	dst[drMask] = m.ErrMask
	for i, k := range m.RKeys {
		be.PutUint32(dst[drKeys+4*i:], k)
	}
	return nil
}

func (m *DeleteRkey) AppendBinary(b []byte) ([]byte, error) { return appendMsg(b, m) }

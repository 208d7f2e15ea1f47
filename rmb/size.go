// RMBE size codes: the 4-bit compressed buffer size carried in CLC Accept/Confirm.
// Implements the RMBE size field of the RFC 7609 CLC Accept/Confirm messages.

package rmb

import (
	"errors"
	"fmt"
)

// SizeCode is the compressed size of an RMBE: size = 16 KiB << code. It travels in the
// high nibble of CLC Accept/Confirm byte 50, so it can never exceed 15.
type SizeCode uint8

const (
	// MinSize is the size of code 0, the smallest RMBE.
	MinSize = 16 << 10
	// DefaultMaxSizeCode caps RMBEs at 512 KiB, as Linux does for SMC-R.
	DefaultMaxSizeCode SizeCode = 5
	// MaxSizeCode is the largest code the 4-bit wire field can carry (512 MiB).
	MaxSizeCode SizeCode = 15
)

// ErrSizeCode reports a peer's size code above the accepted maximum.
var ErrSizeCode = errors.New("rmb: rmbe size code out of range")

// Bytes returns the RMBE size the code stands for. Codes above MaxSizeCode return 0.
func (c SizeCode) Bytes() uint32 {
	if c > MaxSizeCode {
		return 0
	}
	return MinSize << c
}

func (c SizeCode) String() string { return fmt.Sprintf("%d (%d KiB)", uint8(c), c.Bytes()>>10) }

// SizeCodeFor returns the code of the smallest RMBE that holds bytes, capped at
// DefaultMaxSizeCode. Requests of 16 KiB or less (zero and negative included) get code 0.
func SizeCodeFor(bytes int) SizeCode { return SizeCodeForMax(bytes, DefaultMaxSizeCode) }

// SizeCodeForMax is SizeCodeFor with the cap limit (itself capped at MaxSizeCode): the
// size is rounded up to a power of two, then capped at limit.
func SizeCodeForMax(bytes int, limit SizeCode) SizeCode {
	limit = min(limit, MaxSizeCode)
	var c SizeCode
	for c < limit && int64(c.Bytes()) < int64(bytes) {
		c++
	}
	return c
}

// DecodeSizeCode validates a peer's size code against the largest code this end
// accepts (limit, itself capped at MaxSizeCode) and returns the RMBE size in bytes.
func DecodeSizeCode(code uint8, limit SizeCode) (uint32, error) {
	if SizeCode(code) > min(limit, MaxSizeCode) {
		return 0, fmt.Errorf("%w: code %d, max %d", ErrSizeCode, code, min(limit, MaxSizeCode))
	}
	return SizeCode(code).Bytes(), nil
}

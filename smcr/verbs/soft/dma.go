package soft

import "unsafe"

// dmaCopy copies src into dst, registered memory, as a device's DMA would: out
// of the race detector's sight (go:norace leaves this function uninstrumented;
// copy itself would be checked inside the runtime). Memory the verbs layer hands
// a device is ordered by the protocol on top, as with an adapter's DMA or the
// shm provider's memcpy into a mapping the detector does not track (place).
//
//go:norace
func dmaCopy(dst, src []byte) {
	n := min(len(dst), len(src))
	i := 0
	for ; i+8 <= n; i += 8 {
		*(*uint64)(unsafe.Pointer(&dst[i])) = *(*uint64)(unsafe.Pointer(&src[i]))
	}
	for ; i < n; i++ {
		dst[i] = src[i]
	}
}

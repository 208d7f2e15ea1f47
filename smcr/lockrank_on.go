//go:build lockrank

// The lock order checked (lockrank.go): each goroutine's held mutexes are kept
// by goroutine ID, and a mutex taken while one of the same or a higher rank is
// held is a breach, recorded once per pair of ranks with the stack that took it.

package smcr

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"sync"
)

const lockrankOn = true

type heldLock struct {
	rank lockRank
	m    any
}

var lockState struct {
	mu       sync.Mutex
	held     map[uint64][]heldLock
	breaches map[[2]lockRank]string
}

// goid is the calling goroutine's ID, from its stack's first line.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	b = b[:bytes.IndexByte(b, ' ')]
	id, _ := strconv.ParseUint(string(b), 10, 64)
	return id
}

// lockOrder records a breach if r's mutex m is taken out of order; it returns
// the goroutine's ID, for lockHeld.
func lockOrder(r lockRank, m any) uint64 {
	g := goid()
	lockState.mu.Lock()
	defer lockState.mu.Unlock()
	for _, h := range lockState.held[g] {
		if h.rank < r {
			continue
		}
		k := [2]lockRank{h.rank, r}
		if _, ok := lockState.breaches[k]; ok {
			continue
		}
		if lockState.breaches == nil {
			lockState.breaches = map[[2]lockRank]string{}
		}
		stack := make([]byte, 8<<10)
		stack = stack[:runtime.Stack(stack, false)]
		lockState.breaches[k] = fmt.Sprintf("%v taken while holding %v:\n%s", r, h.rank, stack)
	}
	return g
}

func lockHeld(g uint64, r lockRank, m any) {
	lockState.mu.Lock()
	defer lockState.mu.Unlock()
	if lockState.held == nil {
		lockState.held = map[uint64][]heldLock{}
	}
	lockState.held[g] = append(lockState.held[g], heldLock{r, m})
}

// lockFreed forgets m, also when another goroutine than the one that took it
// lets it go (a read hold handed on).
func lockFreed(m any) {
	g := goid()
	lockState.mu.Lock()
	defer lockState.mu.Unlock()
	if forget(g, m) {
		return
	}
	for o := range lockState.held {
		if forget(o, m) {
			return
		}
	}
}

func forget(g uint64, m any) bool {
	hs := lockState.held[g]
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].m == m {
			hs = append(hs[:i], hs[i+1:]...)
			if len(hs) == 0 {
				delete(lockState.held, g)
			} else {
				lockState.held[g] = hs
			}
			return true
		}
	}
	return false
}

// lockOrderBreaches lists the breaches seen so far.
func lockOrderBreaches() []string {
	lockState.mu.Lock()
	defer lockState.mu.Unlock()
	var out []string
	for _, s := range lockState.breaches {
		out = append(out, s)
	}
	return out
}

// forgetLockOrderBreach forgets the breach of taking b while holding a (tests).
func forgetLockOrderBreach(a, b lockRank) {
	lockState.mu.Lock()
	defer lockState.mu.Unlock()
	delete(lockState.breaches, [2]lockRank{a, b})
}

// lockOrderBreached reports whether b was taken while a was held.
func lockOrderBreached(a, b lockRank) bool {
	lockState.mu.Lock()
	defer lockState.mu.Unlock()
	_, ok := lockState.breaches[[2]lockRank{a, b}]
	return ok
}

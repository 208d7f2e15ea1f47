package daemon

import (
	"fmt"
	"testing"

	"github.com/smcr-io/smcr/control"
)

// TestHistoryBounded: the history keeps the last historySize connections,
// newest first.
func TestHistoryBounded(t *testing.T) {
	var h history
	for i := range historySize + 10 {
		h.add(control.ClosedConn{ID: uint64(i), Local: fmt.Sprint(i)})
	}
	l := h.list()
	if len(l) != historySize || l[0].ID != historySize+9 || l[len(l)-1].ID != 10 {
		t.Errorf("%d entries, first %d, last %d; want %d, %d, 10", len(l), l[0].ID, l[len(l)-1].ID, historySize, historySize+9)
	}
}

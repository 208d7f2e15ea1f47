// The port's state: up while its network interface is up and has a carrier, as
// an RNIC's port is ACTIVE while its link is, so that smcr fails the links of an
// interface that went down at once (verbs.PortStater) instead of when TCP gives up.
// Netlink's link notifications stand for an RNIC's port events
// (verbs.PortNotifier), so that smcr need not wait for its next look.

package soft

import (
	"errors"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// portWatch asks netlink, in the network namespace the device was opened in,
// about its interface, and listens there for changes to it.
type portWatch struct {
	ns      netns.NsHandle
	nl      *netlink.Handle
	changes verbs.PortChanges
	stop    chan struct{} // ends the subscription
}

// openPortWatch captures the calling thread's network namespace; nil when there
// is no interface to watch or netlink cannot be had (the port then counts as up).
func openPortWatch(netdev string) *portWatch {
	if netdev == "" {
		return nil
	}
	ns, err := netns.Get()
	if err != nil {
		return nil
	}
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil
	}
	w := &portWatch{ns: ns, nl: nl, stop: make(chan struct{})}
	// Without the subscription, changes are seen when smcr polls PortUp.
	updates := make(chan netlink.LinkUpdate, 16)
	if netlink.LinkSubscribeWithOptions(updates, w.stop, netlink.LinkSubscribeOptions{Namespace: &ns}) == nil {
		go func() {
			for u := range updates { // closed after stop
				if u.Attrs().Name == netdev {
					w.changes.Notify()
				}
			}
		}()
	}
	return w
}

func (w *portWatch) close() {
	if w != nil {
		close(w.stop)
		w.nl.Close()
		w.ns.Close()
	}
}

// next is PortChanged's channel; a device without a watch never changes.
func (w *portWatch) next() <-chan struct{} {
	if w == nil {
		return nil
	}
	return w.changes.Next()
}

// up reports whether netdev is administratively up with a carrier. An interface
// that is gone is down; a question netlink cannot answer counts as up.
func (w *portWatch) up(netdev string) bool {
	if w == nil {
		return true
	}
	l, err := w.nl.LinkByName(netdev)
	if err != nil {
		var nf netlink.LinkNotFoundError
		return !errors.As(err, &nf)
	}
	a := l.Attrs()
	return a.Flags&net.FlagUp != 0 && (a.OperState == netlink.OperUp || a.OperState == netlink.OperUnknown)
}

//go:build ibv

// The device's asynchronous events: a port that goes down or comes back, a queue
// pair the adapter put in the error state, a device that failed, a GID table
// that changed with the interface's addresses (reselect). Linux's SMC-R
// acts on them in smc_ib_global_event_handler (a port error fails the port's
// links at once); here they wake the engine's port watch (verbs.PortNotifier)
// and go to the log. Reading them also matters by itself: the kernel queues
// every event for the context until it is read, without limit.

package ibv

/*
#include <errno.h>
#include <infiniband/verbs.h>

// A flat event, so Go never touches the union of struct ibv_async_event.
struct smcr_async {
	int type;
	int port;        // port events
	uint32_t qp_num; // queue pair events
};

// Returns 1 with *out filled and the event acknowledged, 0 when none is
// pending (EAGAIN), or -errno. A queue pair's number is read before the
// acknowledgement, which is what lets ibv_destroy_qp free it.
static int smcr_get_async(struct ibv_context *c, struct smcr_async *out) {
	struct ibv_async_event ev;
	if (ibv_get_async_event(c, &ev) != 0)
		return errno == EAGAIN ? 0 : -errno;
	out->type = ev.event_type;
	out->port = 0;
	out->qp_num = 0;
	switch (ev.event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		out->qp_num = ev.element.qp->qp_num;
		break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		out->port = ev.element.port_num;
		break;
	default:
		break;
	}
	ibv_ack_async_event(&ev);
	return 1;
}
*/
import "C"

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/smcr-io/smcr/smcr/verbs"
)

// asyncEvents reads a device's async events on a goroutine of its own, waiting
// for them in the Go netpoller on a non-blocking dup of the context's fd.
type asyncEvents struct {
	d    *device
	file *os.File
	raw  syscall.RawConn
	done chan struct{}
	err  error // a failed read, set by the Read callback
}

// watchEvents starts reading d's async events. The caller has not shared d yet.
func (d *device) watchEvents() error {
	fd, err := unix.Dup(int(d.ctx.async_fd))
	if err != nil {
		return fmt.Errorf("ibv: dup async fd: %w", err)
	}
	// O_NONBLOCK belongs to the open file description: ibv_get_async_event on
	// the context's own fd then returns EAGAIN rather than blocking.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return fmt.Errorf("ibv: async fd non-blocking: %w", err)
	}
	e := &asyncEvents{d: d, file: os.NewFile(uintptr(fd), "ibv-async"), done: make(chan struct{})}
	if e.raw, err = e.file.SyscallConn(); err != nil {
		e.file.Close()
		return fmt.Errorf("ibv: async fd: %w", err)
	}
	d.events = e
	go e.run()
	return nil
}

func (e *asyncEvents) run() {
	defer close(e.done)
	for {
		if err := e.raw.Read(e.readEvents); err != nil {
			return // closed
		}
		if e.err != nil {
			e.d.log.Warn("ibv: async events unread from now on", "device", e.d.name, "err", e.err)
			return
		}
	}
}

// readEvents handles every pending event; it returns false to wait for more.
// The netpoller serializes it with stop.
func (e *asyncEvents) readEvents(uintptr) bool {
	for {
		var ev C.struct_smcr_async
		switch rc := C.smcr_get_async(e.d.ctx, &ev); {
		case rc == 0:
			return false
		case rc < 0:
			e.err = syscall.Errno(-rc)
			return true
		}
		e.d.event(&ev)
	}
}

// stop ends the reading and returns once no event is being handled: after it
// the context may close.
func (e *asyncEvents) stop() {
	e.file.Close()
	<-e.done
}

// event acts on one async event. It must not take d.mu: Close holds it while
// it waits for the reader to stop.
func (d *device) event(ev *C.struct_smcr_async) {
	name := C.GoString(C.ibv_event_type_str(uint32(ev._type)))
	switch uint32(ev._type) {
	case C.IBV_EVENT_PORT_ERR, C.IBV_EVENT_PORT_ACTIVE:
		if int(ev.port) != d.port {
			return
		}
		if uint32(ev._type) == C.IBV_EVENT_PORT_ERR {
			d.log.Warn("ibv: port down", "device", d.name, "port", d.port, "netdev", d.Port().Netdev)
		} else {
			d.log.Info("ibv: port up", "device", d.name, "port", d.port, "netdev", d.Port().Netdev)
		}
		d.changes.Notify()
	case C.IBV_EVENT_GID_CHANGE:
		if int(ev.port) != d.port {
			return
		}
		d.reselect()
		d.changes.Notify() // links on a GID that went fail (verbs.GIDHolder)
	case C.IBV_EVENT_DEVICE_FATAL:
		d.fatal.Store(true)
		d.log.Error("ibv: device failed; its links fail over or continue over TCP", "device", d.name)
		d.changes.Notify()
	case C.IBV_EVENT_QP_FATAL, C.IBV_EVENT_QP_REQ_ERR, C.IBV_EVENT_QP_ACCESS_ERR, C.IBV_EVENT_PATH_MIG_ERR:
		// The queue pair is in the error state: its work requests complete
		// flushed, which is how the engine learns it.
		d.log.Warn("ibv: queue pair failed", "device", d.name, "qpn", uint32(ev.qp_num), "event", name)
	case C.IBV_EVENT_CQ_ERR:
		d.log.Error("ibv: completion queue overrun", "device", d.name)
	default:
		d.log.Debug("ibv: async event", "device", d.name, "event", name, "port", int(ev.port), "qpn", uint32(ev.qp_num))
	}
}

// PortChanged is closed when the port goes down or comes back, or the device
// fails (verbs.PortNotifier).
func (d *device) PortChanged() <-chan struct{} { return d.changes.Next() }

var _ verbs.PortNotifier = (*device)(nil)

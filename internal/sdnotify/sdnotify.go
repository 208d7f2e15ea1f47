// Package sdnotify tells systemd about smcrd's state with the sd_notify datagram
// protocol (a Type=notify unit waits for READY=1), without libsystemd or cgo.
//
// The protocol (sd_notify(3)): when NOTIFY_SOCKET is set, send one datagram of
// newline-separated VAR=value assignments to that AF_UNIX socket. A leading '@'
// names an abstract socket. When NOTIFY_SOCKET is unset the process is not run by
// systemd (or not as Type=notify) and every call does nothing.
package sdnotify

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
)

// Common assignments; see sd_notify(3).
const (
	Ready     = "READY=1"
	Reloading = "RELOADING=1"
	Stopping  = "STOPPING=1"
	Watchdog  = "WATCHDOG=1"
)

// EnvSocket is the environment variable systemd sets for a Type=notify service.
const EnvSocket = "NOTIFY_SOCKET"

// Status returns the STATUS= assignment shown by `systemctl status`.
func Status(s string) string { return "STATUS=" + strings.ReplaceAll(s, "\n", " ") }

// Notify sends the assignments in one datagram to $NOTIFY_SOCKET. It reports
// whether a message was sent: false with a nil error when the variable is unset.
func Notify(assignments ...string) (bool, error) {
	return NotifySocket(os.Getenv(EnvSocket), assignments...)
}

// NotifySocket is Notify with the socket address given, for tests and callers that
// unset the environment variable after reading it (so children don't inherit it).
func NotifySocket(addr string, assignments ...string) (bool, error) {
	if addr == "" {
		return false, nil
	}
	if len(assignments) == 0 {
		return false, errors.New("sdnotify: nothing to send")
	}
	for _, a := range assignments {
		if !strings.Contains(a, "=") || strings.Contains(a, "\n") {
			return false, fmt.Errorf("sdnotify: %q is not a single VAR=value line", a)
		}
	}
	if !strings.HasPrefix(addr, "/") && !strings.HasPrefix(addr, "@") {
		return false, fmt.Errorf("sdnotify: %s=%q is neither a path nor an abstract socket", EnvSocket, addr)
	}
	ua := &net.UnixAddr{Name: addr, Net: "unixgram"}
	if addr[0] == '@' {
		ua.Name = "\x00" + addr[1:] // Go spells the abstract namespace with a NUL
	}
	c, err := net.DialUnix("unixgram", nil, ua)
	if err != nil {
		return false, fmt.Errorf("sdnotify: %w", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(strings.Join(assignments, "\n"))); err != nil {
		return false, fmt.Errorf("sdnotify: %w", err)
	}
	return true, nil
}

// Package scm reads the descriptors that travel beside a Unix socket's
// messages (SCM_RIGHTS).
package scm

import "golang.org/x/sys/unix"

// Rights extracts the descriptors of the SCM_RIGHTS control messages in oob.
func Rights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if f, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

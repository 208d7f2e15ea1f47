# A server that hands its connection to another process mid-stream, as a
# master process hands connections to workers: it reads SIZE bytes and
# echoes them, then sends the socket with SCM_RIGHTS to a receiver it starts
# (this script again, which knows nothing of the connection) and closes its
# copy; the receiver echoes the rest of the stream to its end. The bytes the
# client sent meanwhile wait unread in the first process's library when it
# passes the socket: the library hands the connection back to the socket
# first (SMCR_LIB_RELEASE), so that they reach the receiver too.
import os, socket, subprocess, sys


def recv_exact(s, n):
    b = bytearray()
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            sys.exit("early end")
        b += c
    return bytes(b)


if sys.argv[1] == "receiver":
    u = socket.socket(fileno=int(sys.argv[2]))
    _, fds, _, _ = socket.recv_fds(u, 1, 1)
    c = socket.socket(fileno=fds[0])
    u.send(b"r")
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        c.sendall(b)
    c.shutdown(socket.SHUT_WR)
    c.close()
    sys.exit(0)

port, size = int(sys.argv[1]), int(sys.argv[2])
ln = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ln.bind(("0.0.0.0", port))
ln.listen(4)
c, _ = ln.accept()
c.sendall(recv_exact(c, size))
a, b = socket.socketpair()
# subprocess's child is vfork'd: it closes the fds it does not pass in this
# process's memory, which must leave the library's table of them as it was
rcv = subprocess.Popen([sys.executable, __file__, "receiver", str(b.fileno())], pass_fds=[b.fileno()])
b.close()
socket.send_fds(a, [b"x"], [c.fileno()])
a.recv(1)
c.close()
sys.exit(rcv.wait())

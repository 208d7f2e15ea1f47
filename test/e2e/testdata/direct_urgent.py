# Urgent data (MSG_OOB) one way and back on one connection, as a program with
# the direct mode's library sends and reads it: "ab", "!" with MSG_OOB, "cd".
# The reader waits for the urgent byte (select's exceptfds), reads up to the
# mark (SIOCATMARK), takes "!" with recv(MSG_OOB), then reads "cd" without it.
# The socket's owner (F_SETOWN) is the program: it must have had SIGURG. The
# client sends once the server says its owner is set ("g"): urgent data that
# comes before F_SETOWN signals nobody, with the kernel's TCP too.
# Prints "ok" when every step was as Linux's TCP has it; exits 1 otherwise.
# usage: direct_urgent.py - PORT (server: reads first, then sends)
#        direct_urgent.py HOST PORT (client: sends first, then reads)
import fcntl, os, select, signal, socket, struct, sys, time

SIOCATMARK = 0x8905
urged = False


def on_sigurg(sig, frame):
    global urged
    urged = True


signal.signal(signal.SIGURG, on_sigurg)


def atmark(s):
    return struct.unpack("i", fcntl.ioctl(s.fileno(), SIOCATMARK, b"\0" * 4))[0]


def send(s):
    s.sendall(b"ab")
    s.send(b"!", socket.MSG_OOB)
    s.sendall(b"cd")


def read(s, who):
    _, _, x = select.select([], [], [s], 10)
    if not x:
        sys.exit(f"{who}: no urgent data within 10s")
    got = b""
    while not atmark(s):
        b = s.recv(64)  # stops at the mark
        if not b:
            sys.exit(f"{who}: EOF before the mark, after {got!r}")
        got += b
    if got != b"ab":
        sys.exit(f"{who}: read {got!r} before the mark, want b'ab'")
    oob = s.recv(1, socket.MSG_OOB)
    if oob != b"!":
        sys.exit(f"{who}: urgent byte {oob!r}, want b'!'")
    try:
        s.recv(1, socket.MSG_OOB)
        sys.exit(f"{who}: the urgent byte came twice")
    except OSError:
        pass  # EINVAL: taken
    rest = b""
    while len(rest) < 2:
        b = s.recv(64)
        if not b:
            break
        rest += b
    if rest != b"cd":
        sys.exit(f"{who}: read {rest!r} after the mark, want b'cd' (the urgent byte out of line)")
    os.getpid()  # a system call: a pending signal is taken on its way back
    time.sleep(0.01)
    if not urged:
        sys.exit(f"{who}: no SIGURG")


host, port = sys.argv[1], int(sys.argv[2])
if host == "-":
    ln = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ln.bind(("0.0.0.0", port))
    ln.listen(1)
    s, _ = ln.accept()
    fcntl.fcntl(s.fileno(), fcntl.F_SETOWN, os.getpid())
    s.sendall(b"g")  # the owner is set: urgent data from here on signals it
    read(s, "server")
    send(s)
    if s.recv(1) != b"":
        sys.exit("server: bytes after the client's last")
else:
    s = socket.create_connection((host, port))
    fcntl.fcntl(s.fileno(), fcntl.F_SETOWN, os.getpid())
    if s.recv(1) != b"g":
        sys.exit("client: no go-ahead from the server")
    send(s)
    read(s, "client")
    s.close()
print("ok", flush=True)

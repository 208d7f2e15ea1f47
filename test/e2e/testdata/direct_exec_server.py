# An inetd-style server: for each connection a child reads one line (the
# connection is decided by then), makes the socket its stdin and stdout and
# execs cat, which echoes the rest of the stream (or the command given after
# the port).
import os, socket, sys

ln = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ln.bind(("0.0.0.0", int(sys.argv[1])))
cmd = sys.argv[2:] or ["cat"]
ln.listen(16)
while True:
    c, _ = ln.accept()
    if os.fork() == 0:
        ln.close()
        line = b""
        while not line.endswith(b"\n"):
            b = c.recv(1)
            if not b:
                os._exit(1)
            line += b
        os.dup2(c.fileno(), 0)
        os.dup2(c.fileno(), 1)
        c.close()
        os.execvp(cmd[0], cmd)
    c.close()
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass

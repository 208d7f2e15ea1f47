# An inetd-style server: for each connection a child reads one line (the
# connection is decided by then), makes the socket its stdin and stdout and
# execs cat, which echoes the rest of the stream (or the command given after
# the port). With --spawn (or --spawn-noenv: an empty environment, so without
# the library) before the command, the server itself reads the line and starts
# the command with posix_spawn, the socket moved to its stdin and stdout by the
# spawn's file actions (glibc's own clone and execve: the library sees neither).
import os, shutil, socket, sys

ln = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ln.bind(("0.0.0.0", int(sys.argv[1])))
cmd = sys.argv[2:] or ["cat"]
spawn = cmd[0] in ("--spawn", "--spawn-noenv")
env = {} if cmd[0] == "--spawn-noenv" else os.environ
if spawn:
    cmd = cmd[1:] or ["cat"]
ln.listen(16)


def read_line(c):
    line = b""
    while not line.endswith(b"\n"):
        b = c.recv(1)
        if not b:
            return False
        line += b
    return True


while True:
    c, _ = ln.accept()
    if spawn:
        if read_line(c):
            os.posix_spawn(shutil.which(cmd[0]), cmd, env, file_actions=[
                (os.POSIX_SPAWN_DUP2, c.fileno(), 0), (os.POSIX_SPAWN_DUP2, c.fileno(), 1)])
    elif os.fork() == 0:
        ln.close()
        if not read_line(c):
            os._exit(1)
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

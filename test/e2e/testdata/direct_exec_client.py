# direct_exec_server.py's client: sends one line, then SIZE random bytes, and
# reads the echo to the end; prints one JSON line: whether every byte came
# back, and otherwise what happened.
import json, os, socket, sys, threading, hashlib

host, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = os.urandom(size)
s = socket.create_connection((host, port))
s.sendall(b"hello\n")
err = []
def send():
    try:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
    except OSError as e:
        err.append(f"send: {type(e).__name__}: {e}")
threading.Thread(target=send, daemon=True).start()
h, n = hashlib.sha256(), 0
try:
    while True:
        b = s.recv(1 << 16)
        if not b:
            break
        h.update(b)
        n += len(b)
except OSError as e:
    err.append(f"recv: {type(e).__name__}: {e}")
print(json.dumps({"ok": n == size and h.digest() == hashlib.sha256(data).digest(), "bytes": n, "err": "; ".join(err)}))

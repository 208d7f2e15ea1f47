# direct_passfd_server.py's client: sends SIZE random bytes and reads their
# echo, then at once SIZE more (the server passes the connection meanwhile)
# and half-closes, and reads the echo to the end; prints one JSON line:
# whether every byte came back, and otherwise what happened.
import hashlib, json, os, socket, sys, threading

host, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
first, second = os.urandom(size), os.urandom(size)
s = socket.create_connection((host, port))
err = []
got = bytearray()
try:
    s.sendall(first)
    while len(got) < size:
        b = s.recv(size - len(got))
        if not b:
            break
        got += b

    def send():
        try:
            s.sendall(second)
            s.shutdown(socket.SHUT_WR)
        except OSError as e:
            err.append(f"send: {type(e).__name__}: {e}")

    threading.Thread(target=send, daemon=True).start()
    while True:
        b = s.recv(1 << 16)
        if not b:
            break
        got += b
except OSError as e:
    err.append(f"recv: {type(e).__name__}: {e}")
want = first + second
print(json.dumps({"ok": hashlib.sha256(got).digest() == hashlib.sha256(want).digest(), "bytes": len(got), "err": "; ".join(err)}))

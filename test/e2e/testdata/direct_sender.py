# Serves a fixed stream: each connection gets SIZE bytes of the pattern that
# direct_reader.py and the test know (1 MiB blocks, each starting with its
# index), then the end of the stream. One thread per connection, blocking
# sockets. Prints one JSON line per connection when it ends: bytes sent, and
# the error that ended it early, if any. With HOST, it connects to HOST:PORT
# instead and sends on that one connection.
import json, socket, sys, threading

BLOCK = 1 << 20
BASE = bytes((i * 31 + (i >> 9)) & 0xFF for i in range(BLOCK))

def block(k):
    return k.to_bytes(8, "big") + BASE[8:]

port, size = int(sys.argv[1]), int(sys.argv[2])
lock = threading.Lock()

def serve(c):
    sent, err = 0, ""
    try:
        k = 0
        while sent < size:
            b = block(k)[: size - sent]
            c.sendall(b)
            sent += len(b)
            k += 1
        c.shutdown(socket.SHUT_WR)
        c.recv(1)  # the reader closes first
    except OSError as e:
        err = f"{type(e).__name__}: {e}"
    finally:
        c.close()
    with lock:
        print(json.dumps({"sent": sent, "err": err}), flush=True)

if len(sys.argv) > 3:
    serve(socket.create_connection((sys.argv[3], port)))
    sys.exit(0)

ln = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ln.bind(("0.0.0.0", port))
ln.listen(16)
while True:
    c, _ = ln.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()

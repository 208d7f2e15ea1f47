# Reads a stream to its end, at most RATE bytes a second (0: as fast as it
# comes), and prints one JSON line: the bytes received, their sha256, whether
# the stream ended with a clean EOF, and otherwise the error that ended it.
# A reader that gets a short stream must see an error, never a clean EOF.
# HOST "-": it listens on PORT and reads the first connection it accepts.
import hashlib, json, socket, sys, time

host, port, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
h, n, eof, err = hashlib.sha256(), 0, False, ""
start = time.monotonic()
try:
    if host == "-":
        ln = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ln.bind(("0.0.0.0", port))
        ln.listen(1)
        s, _ = ln.accept()
        start = time.monotonic()
    else:
        s = socket.create_connection((host, port))
    print("connected", file=sys.stderr, flush=True)
    while True:
        b = s.recv(1 << 16)
        if not b:
            eof = True
            break
        h.update(b)
        n += len(b)
        if rate > 0:
            ahead = n / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
    s.close()
except OSError as e:
    err = f"{type(e).__name__}: {e}"
print(json.dumps({"bytes": n, "sha256": h.hexdigest(), "eof": eof, "err": err,
                  "seconds": time.monotonic() - start}))

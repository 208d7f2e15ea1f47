# Talks memcached's text protocol on C connections at once, one thread each:
# each stores K random values (1 B to 512 KiB) under its own keys, reads them
# back with one multi-get, and checks every byte. Prints one JSON line: whether
# every value came back intact, the local ports used, and the value bytes moved.
import json, os, random, socket, sys, threading

host, port, conns, keys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])


def read_line(f):
    line = f.readline()
    if not line.endswith(b"\r\n"):
        raise EOFError("connection closed mid-reply")
    return line[:-2]


def one(i, out):
    s = socket.create_connection((host, port))
    f = s.makefile("rb")
    values = {}
    for k in range(keys):
        key = b"c%d-k%d" % (i, k)
        v = os.urandom(random.choice([1, 100, 4096, 65536 + 17, 512 << 10]))
        values[key] = v
        s.sendall(b"set %s 0 0 %d\r\n" % (key, len(v)) + v + b"\r\n")
        if read_line(f) != b"STORED":
            raise RuntimeError("set %r not stored" % key)
    s.sendall(b"get " + b" ".join(values) + b"\r\n")
    got = {}
    while True:
        line = read_line(f)
        if line == b"END":
            break
        _, key, _, n = line.split()
        got[key] = f.read(int(n) + 2)[:-2]
    ok = got == values
    local = s.getsockname()[1]
    s.sendall(b"quit\r\n")
    s.close()
    out[i] = (ok, local, sum(len(v) for v in values.values()))


out = [None] * conns
threads = [threading.Thread(target=one, args=(i, out)) for i in range(conns)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"ok": all(r is not None and r[0] for r in out),
                  "ports": [r[1] for r in out if r], "bytes": sum(r[2] for r in out if r)}))

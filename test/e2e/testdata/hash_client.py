# Sends N random bytes on each of C connections at once (asyncio: nonblocking
# sockets and epoll), reads the echo to EOF, and prints one JSON line: whether
# every byte came back, and the local ports used.
import asyncio, hashlib, json, os, sys

host, port, size, conns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

async def one():
    r, w = await asyncio.open_connection(host, port)
    data = os.urandom(size)
    async def send():
        for i in range(0, len(data), 1 << 15):
            w.write(data[i:i + (1 << 15)])
            await w.drain()
        w.write_eof()
    sender = asyncio.create_task(send())
    h, n = hashlib.sha256(), 0
    while True:
        b = await r.read(1 << 16)
        if not b:
            break
        h.update(b)
        n += len(b)
    await sender
    local = w.get_extra_info("sockname")[1]
    w.close()
    return h.digest() == hashlib.sha256(data).digest() and n == size, local

async def main():
    res = await asyncio.gather(*(one() for _ in range(conns)))
    print(json.dumps({"ok": all(r[0] for r in res), "ports": [r[1] for r in res]}))

asyncio.run(main())

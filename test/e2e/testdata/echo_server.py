# A threaded TCP echo server: each connection gets back what it sends, then
# the end of the stream once its peer shuts down writing. Blocking sockets,
# one thread each (the direct mode's blocking calls).
import socket, sys, threading

def serve(c):
    with c:
        while True:
            b = c.recv(1 << 16)
            if not b:
                break
            c.sendall(b)
        c.shutdown(socket.SHUT_WR)

ln = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ln.bind(("0.0.0.0", int(sys.argv[1])))
ln.listen(128)
while True:
    c, _ = ln.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()

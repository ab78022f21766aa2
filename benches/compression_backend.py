# Streams N MiB of page-like text (chunked, text/plain) for every GET.
import sys, http.server, random
N = int(sys.argv[2])
words = [b"duet", b"balances", b"requests", b"over", b"backends", b"<p>", b"</p>", b"and", b"streams", b"bodies"]
rng = random.Random(7)
words = words + [b"%d" % i for i in range(2000)] + [b"w%x" % rng.getrandbits(24) for _ in range(3000)]
corpus = b"".join(rng.choice(words) + (b"\n" if rng.random() < 0.2 else b" ") for _ in range(1500000))[: 8 << 20]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(N * 16):
            at = (i * 65536) % len(corpus)
            block = corpus[at:at + 65536]
            self.wfile.write(b"%x\r\n" % len(block) + block + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()

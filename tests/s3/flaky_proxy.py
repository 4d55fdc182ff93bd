# SPDX-License-Identifier: MIT
"""An unreliable S3 endpoint in front of a real one, for the retry tests.

Usage: flaky_proxy.py UPSTREAM_PORT [SECONDS]  (prints the port it listens on)

For each distinct request (method, path with query, and Range) the first
attempt gets its connection closed without an answer, the second 503
SlowDown; a ranged GET's third gets the store's answer cut in half (all
headers, then half the body, then the connection closed); the rest go to
the store unchanged (the Host header included, so the SigV4 signature
still holds). A path holding "always-503" always gets 503.
With a second argument, SECONDS, it is a slow endpoint instead: every
request reaches the store unchanged, SECONDS late (for tests that stop an
export part-way).
Every connection serves one request (a dropped one is then always a fresh
connection, which libcurl does not retry by itself as it does a reused one
that died).
"""
import http.client
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

UPSTREAM = int(sys.argv[1])
DELAY = float(sys.argv[2]) if len(sys.argv) > 2 else None
seen = {}
lock = threading.Lock()

SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            b'<Message>Please reduce your request rate.</Message></Error>')


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer_503(self):
        self.send_response(503)
        self.send_header("Connection", "close")
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(SLOWDOWN)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(SLOWDOWN)

    def forward(self, truncate=False):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        up = http.client.HTTPConnection("127.0.0.1", UPSTREAM, timeout=60)
        up.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in self.headers.items():
            up.putheader(name, value)
        up.endheaders(body)
        r = up.getresponse()
        data = r.read()
        self.send_response(r.status, r.reason)
        for name, value in r.getheaders():
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            if self.command != "HEAD":
                self.wfile.write(data[: len(data) // 2] if truncate else data)
        except BrokenPipeError:
            pass  # the client was stopped (a test kills it mid-request)
        up.close()

    def handle_any(self):
        ranged = self.command == "GET" and "Range" in self.headers
        key = (self.command, self.path, self.headers.get("Range"))
        with lock:
            n = seen.get(key, 0)
            seen[key] = n + 1
        self.close_connection = True
        if DELAY is not None:
            time.sleep(DELAY)
            self.forward()
        elif "always-503" in self.path or n == 1:
            self.answer_503()
        elif n == 0:
            self.connection.shutdown(2)  # no answer at all
        else:
            self.forward(truncate=ranged and n == 2)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = handle_any


class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


if __name__ == "__main__":
    server = Server(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()

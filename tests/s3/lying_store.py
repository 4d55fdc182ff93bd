# SPDX-License-Identifier: MIT
"""A small S3 endpoint (path-style, unsigned requests accepted) that serves one folder and lies
in the ways issue 37's hostile pass found, one per run.

Usage: lying_store.py DIR BUCKET PREFIX MODE  (prints the port it listens on)

Every file under DIR is object PREFIX/<its path> of BUCKET, with the ETag "same" (a store whose
ETags are not content hashes). MODE:
  honest      answers as S3 does
  endless     every listing page says IsTruncated with the same NextContinuationToken
  trickle     object bodies sent at 2 bytes a second
  norange     ranged GETs answered 200 with the whole object
  bigheader   object answers carry a 300 KiB header
  stray       the listing also holds PREFIX//<file> (an empty path component)
  fail503     object GETs always answered 503 SlowDown
"""
import os
import socketserver
import sys
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote, urlsplit

ROOT, BUCKET, PREFIX, MODE = sys.argv[1], sys.argv[2], sys.argv[3].strip("/"), sys.argv[4]
FILES = {}
for base, _, names in os.walk(ROOT):
    for n in names:
        rel = os.path.relpath(os.path.join(base, n), ROOT)
        FILES[f"{PREFIX}/{rel}"] = os.path.join(base, n)
if MODE == "stray":  # as `aws s3 cp x s3://b/p//y` writes it
    some = sorted(FILES)[0]
    d, f = some.rsplit("/", 1)
    FILES[f"{d}//{f}"] = FILES[some]


def listing(prefix, token):
    keys = sorted(k for k in FILES if k.startswith(prefix))
    body = ['<?xml version="1.0" encoding="UTF-8"?><ListBucketResult>',
            f"<Name>{BUCKET}</Name><Prefix>{prefix}</Prefix><KeyCount>{len(keys)}</KeyCount>"]
    for k in keys:
        body.append(f"<Contents><Key>{k}</Key><LastModified>2026-12-01T00:00:00.000Z</LastModified>"
                    f"<ETag>&quot;same&quot;</ETag><Size>{os.path.getsize(FILES[k])}</Size></Contents>")
    if MODE == "endless":
        body.append("<IsTruncated>true</IsTruncated><NextContinuationToken>again</NextContinuationToken>")
    else:
        body.append("<IsTruncated>false</IsTruncated>")
    body.append("</ListBucketResult>")
    return "".join(body).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status, body, headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if MODE == "trickle" and status in (200, 206):
            for i in range(0, len(body), 2):
                self.wfile.write(body[i:i + 2])
                self.wfile.flush()
                time.sleep(1)
        else:
            self.wfile.write(body)

    def do_GET(self):
        url = urlsplit(self.path)
        path = unquote(url.path).lstrip("/")
        q = parse_qs(url.query)
        if path == BUCKET and "list-type" in q:
            return self.send(200, listing(q.get("prefix", [""])[0], q.get("continuation-token")),
                             [("Content-Type", "application/xml")])
        key = path[len(BUCKET) + 1:] if path.startswith(BUCKET + "/") else None
        if key not in FILES:
            return self.send(404, b"<Error><Code>NoSuchKey</Code></Error>")
        if MODE == "fail503" and self.command == "GET":
            return self.send(503, b"<Error><Code>SlowDown</Code></Error>")
        data = open(FILES[key], "rb").read()
        headers = [("ETag", '"same"'), ("Last-Modified", "Tue, 01 Dec 2026 00:00:00 GMT")]
        if MODE == "bigheader":
            headers.append(("X-Padding", "x" * (300 << 10)))
        rng = self.headers.get("Range")
        if rng and MODE != "norange" and self.command == "GET":
            a, b = rng.split("=")[1].split("-")
            a, b = int(a), min(int(b), len(data) - 1)
            return self.send(206, data[a:b + 1],
                             headers + [("Content-Range", f"bytes {a}-{b}/{len(data)}")])
        self.send(200, data, headers)

    do_HEAD = do_GET


class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


srv = Server(("127.0.0.1", 0), Handler)
print(srv.server_address[1], flush=True)
srv.serve_forever()

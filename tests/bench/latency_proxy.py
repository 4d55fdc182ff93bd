#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A store further away, for benchmarks (helper, not a test).

    latency_proxy.py UPSTREAM_PORT MILLISECONDS    (prints the port it listens on)

A TCP proxy on loopback in front of a store on loopback: every byte a
client sends reaches the store MILLISECONDS late, answers come back at
once. So each request waits that long before the store sees it, as a
request to S3 waits 10-50 ms for its first byte, while connections stay
open between requests (libcurl's pool) and bodies stream at loopback
speed. Loopback itself is left alone: no qdisc is changed (this kernel
has no netem either), so other programs on the machine see no delay.
"""
import asyncio
import sys

UPSTREAM = int(sys.argv[1])
DELAY = float(sys.argv[2]) / 1000
CHUNK = 1 << 18


async def late(reader, writer):
    """Client to store: each chunk written DELAY after it was read, in order."""
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def send():
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    sender = asyncio.ensure_future(send())
    try:
        while data := await reader.read(CHUNK):
            queue.put_nowait((loop.time() + DELAY, data))
    finally:
        queue.put_nowait((0, None))
        await sender


async def at_once(reader, writer):
    """Store to client: as it comes."""
    while data := await reader.read(CHUNK):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()


async def serve(creader, cwriter):
    try:
        ureader, uwriter = await asyncio.open_connection("127.0.0.1", UPSTREAM)
    except OSError:
        cwriter.close()
        return
    try:
        await asyncio.gather(late(creader, uwriter), at_once(ureader, cwriter))
    except (ConnectionError, OSError):
        pass
    finally:
        uwriter.close()
        cwriter.close()


async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())

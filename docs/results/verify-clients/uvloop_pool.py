"""Does a new connection to a numeric address go through libuv's thread pool? CPU time the process's `libuv-worker`
threads ran over 200 `sock_connect`s to 127.0.0.1 and over 200 new aiohttp connections, under uvloop and under
asyncio's own loop (which has no such pool):

    python3 docs/results/verify-clients/uvloop_pool.py > docs/results/verify-clients/uvloop_pool.txt
"""

import asyncio
import os
import socket

import aiohttp
import uvloop


def pool() -> tuple[int, int]:
    """(libuv-worker threads, the CPU ns they have run)."""
    threads, ran = 0, 0
    for tid in os.listdir("/proc/self/task"):
        if open(f"/proc/self/task/{tid}/comm").read().strip() == "libuv-worker":
            threads += 1
            ran += int(open(f"/proc/self/task/{tid}/schedstat").read().split()[0])
    return threads, ran


async def main(n: int = 200) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await reader.read(65536):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    _, before = pool()
    for _ in range(n):
        with socket.socket() as sock:
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", port))
    threads, after = pool()
    print(f"{type(loop).__module__}: {n} sock_connect: {threads} libuv-worker threads ran "
          f"{(after - before) / 1e6:.2f} ms")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as session:
        for _ in range(n):
            async with session.get(f"http://127.0.0.1:{port}/") as response:
                await response.read()
    threads, last = pool()
    print(f"{type(loop).__module__}: {n} new aiohttp connections: {threads} libuv-worker threads ran "
          f"{(last - after) / 1e6:.2f} ms")


if __name__ == "__main__":
    uvloop.run(main())
    asyncio.run(main())

"""A TCP relay that adds a fixed latency in each direction (netem's `delay`, in user space).

    python delayproxy.py --listen 198.18.0.1:55500 --target 127.0.0.1:55401 --delay-ms 100

Every chunk read from one side is written to the other `delay-ms` later, in
order, so a round trip through the relay costs twice the delay on top of the
real one; bandwidth is not limited. Used where the kernel lacks sch_netem.
Prints "listening" once ready; runs until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read() -> None:
        while True:
            data = await reader.read(65536)
            await queue.put((time.monotonic() + delay, data))
            if not data:
                return

    async def write() -> None:
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    reading = asyncio.ensure_future(read())
    try:
        await write()
    finally:
        reading.cancel()


async def _serve(listen: tuple[str, int], target: tuple[str, int], delay: float) -> None:
    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            s_reader, s_writer = await asyncio.open_connection(*target)
        except OSError:
            c_writer.close()
            return
        # The connection itself (the SYN's round trip) is delayed like the data.
        await asyncio.sleep(2 * delay)
        pumps = [
            asyncio.ensure_future(_pump(c_reader, s_writer, delay)),
            asyncio.ensure_future(_pump(s_reader, c_writer, delay)),
        ]
        with contextlib.suppress(Exception):
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for pump in pumps:
            pump.cancel()
        for w in (c_writer, s_writer):
            w.close()

    server = await asyncio.start_server(handle, *listen)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", type=_address, required=True)
    parser.add_argument("--target", type=_address, required=True)
    parser.add_argument("--delay-ms", type=float, required=True)
    args = parser.parse_args()
    asyncio.run(_serve(args.listen, args.target, args.delay_ms / 1000))


if __name__ == "__main__":
    main()

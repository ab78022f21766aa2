#!/usr/bin/env python3
"""An open-loop HTTP/1.1 client for benches/rate_limit.sh: requests sent at a fixed rate whatever the
answers (a closed-loop client such as wrk slows down when the server does, and would hide a limiter
that lets too much through), from one source address, over keep-alive connections opened as needed.

    open_loop.py HOST PORT PATH RATE SECONDS SOURCE_IP

Prints one JSON line: requests sent, answers by status, answers with status 200 in each second (by
the time the request was sent), and the p50/p99 latency of the 200s in milliseconds.
"""
import asyncio, json, sys, time


async def exchange(state, request):
    """Sends `request` on an idle connection (a new one if none is idle); the status, or 0."""
    host, port, source = state["host"], state["port"], state["source"]
    if state["idle"]:
        reader, writer = state["idle"].pop()
    else:
        reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
    try:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length, close = 0, False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and b"close" in value.lower():
                close = True
        if length:
            await reader.readexactly(length)
        if close:
            writer.close()
        else:
            state["idle"].append((reader, writer))
        return status
    except (OSError, asyncio.IncompleteReadError, ValueError):
        writer.close()
        return 0


async def main():
    host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rate, seconds, source = float(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
    request = f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()
    state = {"host": host, "port": port, "source": source, "idle": []}
    statuses, per_second, latencies, tasks = {}, [0] * int(seconds + 1), [], []

    async def one(sent_at, second):
        status = await exchange(state, request)
        statuses[status] = statuses.get(status, 0) + 1
        if status == 200:
            per_second[second] += 1
            latencies.append((time.perf_counter() - sent_at) * 1000)

    start = time.perf_counter()
    total = int(rate * seconds)
    for i in range(total):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(time.perf_counter(), int(i / rate))))
    await asyncio.gather(*tasks)
    latencies.sort()
    pick = lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 3) if latencies else None
    print(json.dumps({
        "sent": total,
        "elapsed": round(time.perf_counter() - start, 3),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "ok_per_second": per_second[: int(seconds)],
        "p50_ms": pick(0.50),
        "p99_ms": pick(0.99),
    }))


asyncio.run(main())

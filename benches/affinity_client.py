#!/usr/bin/env python3
"""A closed-loop HTTP/1.1 client for benches/affinity.sh: CONCURRENCY keep-alive connections each send
`GET /` with `x-user: KEY` one after another for SECONDS, the keys drawn from a fixed seeded stream in
which one hot key takes HOT of the requests and the rest are uniform over KEYS users.

    affinity_client.py HOST PORT CONCURRENCY SECONDS KEYS HOT

Prints one JSON line: requests answered 200; the share of each key's requests on its home (the backend
that served most of that key's requests here), over all keys and for the hot key alone; the busiest
backend's share of the requests over the mean backend's; the p50 and p99 latency in ms.
"""
import asyncio, json, random, sys, time
from collections import Counter, defaultdict


async def worker(host, port, keys, deadline, served, latencies):
    reader, writer = await asyncio.open_connection(host, port)
    for key in keys:
        if time.perf_counter() >= deadline:
            break
        sent = time.perf_counter()
        writer.write(f"GET / HTTP/1.1\r\nHost: bench\r\nx-user: {key}\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        length, backend = 0, None
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"x-backend":
                backend = value.strip().decode()
        if length:
            await reader.readexactly(length)
        if head[9:12] == b"200":
            served[key][backend] += 1
            latencies.append((time.perf_counter() - sent) * 1000)
    writer.close()


async def main():
    host, port = sys.argv[1], int(sys.argv[2])
    concurrency, seconds = int(sys.argv[3]), float(sys.argv[4])
    users, hot = int(sys.argv[5]), float(sys.argv[6])
    rng = random.Random(48)
    # Enough keys for any connection at any speed: each connection walks its own slice of the stream.
    stream = ["hot" if rng.random() < hot else f"user-{rng.randrange(users)}" for _ in range(400_000)]
    per = len(stream) // concurrency
    served, latencies = defaultdict(Counter), []
    deadline = time.perf_counter() + seconds
    await asyncio.gather(*(
        worker(host, port, stream[i * per:(i + 1) * per], deadline, served, latencies)
        for i in range(concurrency)))
    total = sum(sum(c.values()) for c in served.values())
    home = sum(max(c.values()) for c in served.values())
    hot_total = sum(served["hot"].values()) or 1
    per_backend = Counter()
    for counts in served.values():
        per_backend.update(counts)
    latencies.sort()
    pct = lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2)
    print(json.dumps({
        "requests": total,
        "home_share": round(home / total, 4),
        "hot_home_share": round(max(served["hot"].values(), default=0) / hot_total, 4),
        "hot_backends": len(served["hot"]),
        "busiest_over_mean": round(max(per_backend.values()) * len(per_backend) / total, 3),
        "backends": len(per_backend),
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
    }))


asyncio.run(main())

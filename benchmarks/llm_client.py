"""Benchmark of memloop's chat client against a loopback fake OpenAI server (its own process).

(a) per-call overhead of client + cache against a zero-latency server (target: median < 2 ms);
(b) throughput at concurrency 1, 2, 4, 8, 16 against a 200 ms server (target: speed-up >= 0.8 N).

Run: .venv/bin/python benchmarks/llm_client.py [--calls 500] [--json out.json]"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.testing.fake_server import serve_in_subprocess


def overhead(calls: int, workdir: Path) -> dict:
    proc, url = serve_in_subprocess(latency_s=0.0)
    try:
        client = ChatClient(
            Endpoint(model="bench", base_url=url, max_concurrency=1),
            cache=workdir / "overhead.sqlite",
        )
        for i in range(20):  # warm-up: connection, imports
            client.chat([{"role": "user", "content": f"warm {i}"}], component="agent")
        miss, hit = [], []
        for i in range(calls):
            msgs = [{"role": "user", "content": f"question {i}"}]
            t = time.perf_counter()
            client.chat(msgs, component="agent")
            miss.append(time.perf_counter() - t)
            t = time.perf_counter()
            client.chat(msgs, component="agent")
            hit.append(time.perf_counter() - t)
        client.close()
        raw = []  # the same request with a bare HTTP client: what the server and loopback cost
        with httpx.Client() as http:
            body = {
                "model": "bench",
                "messages": [{"role": "user", "content": "raw"}],
                "temperature": 0.0,
                "max_tokens": 512,
            }
            for _ in range(calls):
                t = time.perf_counter()
                http.post(url + "/chat/completions", json=body).json()
                raw.append(time.perf_counter() - t)
    finally:
        proc.terminate()
    ms = lambda xs: round(statistics.median(xs) * 1000, 3)  # noqa: E731
    p95 = lambda xs: round(sorted(xs)[int(len(xs) * 0.95)] * 1000, 3)  # noqa: E731
    return {
        "calls": calls,
        "miss_median_ms": ms(miss),
        "miss_p95_ms": p95(miss),
        "hit_median_ms": ms(hit),
        "hit_p95_ms": p95(hit),
        "raw_http_median_ms": ms(raw),
        "client_overhead_median_ms": round(ms(miss) - ms(raw), 3),
    }


def throughput(levels: list[int], per_level: int, workdir: Path) -> list[dict]:
    proc, url = serve_in_subprocess(latency_s=0.2)
    rows = []
    try:
        base = None
        for n in levels:
            client = ChatClient(
                Endpoint(model=f"bench-c{n}", base_url=url, max_concurrency=n),
                cache=workdir / f"thr{n}.sqlite",
            )
            count = per_level * n
            t = time.perf_counter()
            with ThreadPoolExecutor(max_workers=n) as pool:
                list(
                    pool.map(
                        lambda i, client=client: client.chat(
                            [{"role": "user", "content": f"q{i}"}], component="agent"
                        ),
                        range(count),
                    )
                )
            elapsed = time.perf_counter() - t
            client.close()
            rps = count / elapsed
            base = base or rps
            rows.append(
                {
                    "concurrency": n,
                    "requests": count,
                    "seconds": round(elapsed, 3),
                    "req_per_s": round(rps, 2),
                    "speedup": round(rps / base, 2),
                    "target": round(0.8 * n, 2),
                    "meets_target": rps / base >= 0.8 * n,
                }
            )
    finally:
        proc.terminate()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--per-level", type=int, default=10, help="requests per unit of concurrency")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ov = overhead(args.calls, Path(tmp))
        print(f"(a) overhead per call, {ov['calls']} calls against a zero-latency loopback server:")
        print(
            f"    cache miss (HTTP round trip + cache write): median {ov['miss_median_ms']} ms, "
            f"p95 {ov['miss_p95_ms']} ms   target median < 2 ms: "
            f"{'met' if ov['miss_median_ms'] < 2 else 'NOT met'}"
        )
        print(
            f"    bare HTTP round trip (httpx, no client):     median {ov['raw_http_median_ms']} ms"
            f"  => client + cache overhead ~ {ov['client_overhead_median_ms']} ms per call"
        )
        print(
            f"    cache hit:                                  median {ov['hit_median_ms']} ms, "
            f"p95 {ov['hit_p95_ms']} ms"
        )
        rows = throughput([1, 2, 4, 8, 16], args.per_level, Path(tmp))
    print("(b) throughput against a 200 ms loopback server:")
    print("    concurrency  requests  seconds  req/s   speed-up  target(0.8N)")
    for r in rows:
        print(
            f"    {r['concurrency']:>11}  {r['requests']:>8}  {r['seconds']:>7}  "
            f"{r['req_per_s']:>5}  {r['speedup']:>8}  {r['target']:>6}  "
            f"{'met' if r['meets_target'] else 'NOT met'}"
        )
    if args.json:
        args.json.write_text(json.dumps({"overhead": ov, "throughput": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

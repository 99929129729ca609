"""Measures `inferno serve` through its HTTP API (Python standard library only, so it runs on a
GPU machine with nothing installed): C concurrent clients, each sending R streamed
/v1/completions requests back to back, each with its own pseudo-random prompt of P token ids
(so the prefix cache never serves one) and N tokens to generate greedily.

    python3 benches/serve_load.py --port 8080 -c 8 -r 4 -p 512 -n 128

Prints JSON: aggregate generated tok/s over the wall time, per-request decode tok/s (tokens
after the first over the time after the first, as `inferno bench` reports decode), and TTFT
p50/p99 as the client sees it.
"""

import argparse
import http.client
import json
import random
import statistics
import threading
import time


def one(host, port, prompt, max_tokens):
    conn = http.client.HTTPConnection(host, port, timeout=600)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, (resp.status, resp.read())
    first = last = None
    tokens = 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            break
        obj = json.loads(data)
        if "error" in obj:
            raise RuntimeError(obj)
        if obj.get("usage"):
            tokens = obj["usage"]["completion_tokens"]
        for ch in obj.get("choices", []):
            if ch.get("text"):
                now = time.perf_counter()
                first = first or now
                last = now
    conn.close()
    ttft = (first or time.perf_counter()) - t0
    decode = (tokens - 1) / (last - first) if first and last and last > first else 0.0
    return ttft, decode, tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("-c", "--concurrency", type=int, default=1)
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("-p", "--prompt-tokens", type=int, default=512)
    ap.add_argument("-n", "--gen-tokens", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=200000)
    ap.add_argument("--warmup", type=int, default=1, help="rounds not measured")
    a = ap.parse_args()
    rng = random.Random(0)
    results, lock = [], threading.Lock()

    def client(rounds, record):
        for _ in range(rounds):
            with lock:
                prompt = [rng.randrange(1000, a.vocab) for _ in range(a.prompt_tokens)]
            r = one(a.host, a.port, prompt, a.gen_tokens)
            if record:
                with lock:
                    results.append(r)

    def run(rounds, record):
        threads = [threading.Thread(target=client, args=(rounds, record)) for _ in range(a.concurrency)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    run(a.warmup, False)
    wall = run(a.rounds, True)
    ttfts = sorted(r[0] for r in results)
    pct = lambda q: ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))]
    print(json.dumps({
        "concurrency": a.concurrency, "requests": len(results), "prompt_tokens": a.prompt_tokens,
        "gen_tokens": a.gen_tokens,
        "aggregate_tok_s": sum(r[2] for r in results) / wall,
        "decode_tok_s_median": statistics.median(r[1] for r in results),
        "ttft_p50_ms": pct(0.5) * 1e3, "ttft_p99_ms": pct(0.99) * 1e3,
        "tokens": sum(r[2] for r in results), "wall_s": wall,
    }))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The soak driver behind scripts/soak.sh: sequential generations, then mixed load through a
running `inferno serve`, sampling the server process; prints the start-vs-end table and exits 1
when anything grew past its threshold after warm-up or a request failed.

Only the standard library: it runs on a bare GPU machine. Every request goes to the server's
address (127.0.0.1), and every loop is bounded by count or by the deadline.
"""

import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing".split()


def env_int(name, default):
    return int(os.environ.get(name, default))


class Soak:
    def __init__(self, host, port, pid):
        self.host, self.port, self.pid = host, port, pid
        self.lock = threading.Lock()
        self.latencies = []  # (time, kind, seconds)
        self.errors = []
        self.counts = {}
        self.samples = []  # (time, phase, device_mb, rss_mb, fds, threads)
        self.phase = "sequential"
        rng = random.Random(1)
        self.long_prompt = " ".join(rng.choice(WORDS) for _ in range(env_int("SOAK_LONG_WORDS", 600)))

    # ------------------------------------------------------------------ requests

    def post(self, path, body, stream=False, cancel_after=None):
        """One request; True when it was answered as it should be."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=600)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                return f"{path} {resp.status}: {resp.read()[:300]!r}"
            if not stream:
                return json.loads(resp.read())
            events = 0
            for line in resp:
                if line.startswith(b"data: "):
                    events += 1
                    if b'"error"' in line:
                        return f"{path} stream error: {line[:300]!r}"
                    if cancel_after is not None and events >= cancel_after:
                        return {"cancelled": True}
            return {"events": events}
        except (OSError, http.client.HTTPException, ValueError) as e:
            return f"{path}: {type(e).__name__}: {e}"
        finally:
            conn.close()

    def chat(self, content, max_tokens, **extra):
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
        body.update(extra)
        return body

    def one(self, kind):
        """Runs one request of `kind`; records its latency or its failure."""
        t0 = time.monotonic()
        if kind == "short":
            r = self.post("/v1/chat/completions", self.chat("Say hello.", 16))
        elif kind == "long":
            r = self.post("/v1/chat/completions", self.chat(f"Summarize: {self.long_prompt}", 32))
        elif kind == "stream":
            r = self.post("/v1/chat/completions", self.chat("Count to twenty.", 64, stream=True), stream=True)
        elif kind == "cancel":
            body = self.chat("Tell a long story.", 512, stream=True)
            r = self.post("/v1/chat/completions", body, stream=True, cancel_after=3)
        elif kind == "structured":
            fmt = {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA}}
            r = self.post("/v1/chat/completions", self.chat("A trip as JSON.", 64, response_format=fmt))
            r = check_structured(r)
        elif kind == "tool":
            body = self.chat("Weather in Paris?", 64, tools=[TOOL], tool_choice="required")
            r = check_tool(self.post("/v1/chat/completions", body))
        else:  # completion
            r = self.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 16})
        took = time.monotonic() - t0
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if isinstance(r, str):
                self.errors.append(r)
            else:
                self.latencies.append((time.monotonic(), self.phase, kind, took))

    # ------------------------------------------------------------------ sampling

    def sample(self):
        status = read(f"/proc/{self.pid}/status")
        field = lambda k: int(next(l.split()[1] for l in status.splitlines() if l.startswith(k)))
        fds = len(os.listdir(f"/proc/{self.pid}/fd"))
        self.samples.append((time.monotonic(), self.phase, device_mb(self.pid), field("VmRSS:") / 1024, fds, field("Threads:")))

    def sampler(self, stop, every):
        """Samples every `every` s and prints a progress line each minute, so that a run cut
        short (a machine taken back) still leaves its numbers."""
        t0, per_minute = time.monotonic(), max(1, round(60 / every))
        while not stop.wait(every):
            self.sample()
            if len(self.samples) % per_minute == 0:
                self.progress(t0)

    def progress(self, t0):
        now = time.monotonic()
        with self.lock:
            done, failed = sum(self.counts.values()), len(self.errors)
            recent = [x[3] for x in self.latencies if x[2] == "short" and x[0] >= now - 60]
        _, phase, dev, rss, fds, threads = self.samples[-1]
        dev = "n/a" if dev is None else f"{dev}"
        print(
            f"soak: {(now - t0) / 60:5.1f} min in, {phase}: {done} requests, {failed} failed; device MB {dev}, "
            f"RSS MB {rss:.1f}, fds {fds}, threads {threads}; short p50 {pct(recent, 0.5):.3f} s",
            file=sys.stderr,
            flush=True,
        )

    # ------------------------------------------------------------------ phases

    def run(self, sequential, minutes, clients, every):
        stop = threading.Event()
        self.sample()
        threading.Thread(target=self.sampler, args=(stop, every), daemon=True).start()
        t0 = time.monotonic()
        for _ in range(sequential):
            self.one("short")
        print(f"soak: {sequential} sequential generations in {time.monotonic() - t0:.0f} s", file=sys.stderr)
        self.phase = "mixed"
        deadline = time.monotonic() + minutes * 60
        workers = [threading.Thread(target=self.client, args=(i, deadline)) for i in range(clients)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        stop.set()
        self.sample()

    def client(self, i, deadline):
        rng = random.Random(i)
        kinds = ["short"] * 4 + ["long"] * 2 + ["stream"] * 2 + ["cancel", "structured", "tool", "completion"]
        while time.monotonic() < deadline:
            self.one(rng.choice(kinds))


def check_structured(r):
    if isinstance(r, str):
        return r
    choice = r["choices"][0]
    if choice["finish_reason"] != "stop":
        return r  # cut by max_tokens: the JSON may be unfinished
    try:
        json.loads(choice["message"]["content"])
    except ValueError:
        return f"structured output is not JSON: {choice['message']['content'][:200]!r}"
    return r


def check_tool(r):
    if isinstance(r, str):
        return r
    if r["choices"][0]["finish_reason"] == "length":
        return r  # cut by max_tokens (gpt-oss may reason first): no call yet
    calls = r["choices"][0]["message"].get("tool_calls") or []
    return r if calls else f"tool_choice required but no tool call: {json.dumps(r)[:300]}"


def read(path):
    with open(path) as f:
        return f.read()


def device_mb(pid):
    """GPU memory the process holds (nvidia-smi), else None."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    used = [int(m) for p, m in (l.split(",") for l in out.strip().splitlines() if "," in l) if int(p) == pid]
    return sum(used) if used else None


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def window(items, start, end):
    return [x for x in items if start <= x[0] <= end]


def report(s, warmup_frac):
    """The start-vs-end table; the list of thresholds passed."""
    mixed = [x for x in s.samples if x[1] == "mixed"]
    if len(mixed) < 4:
        print("soak: too few samples for a verdict (run longer)", file=sys.stderr)
        return ["too few samples"]
    t_start, t_end = mixed[0][0], mixed[-1][0]
    span = t_end - t_start
    warm = t_start + span * warmup_frac
    win = max(span * 0.1, 1)
    first, last = window(mixed, warm, warm + win), window(mixed, t_end - win, t_end)
    med = lambda rows, i: statistics.median(r[i] for r in rows) if rows and rows[0][i] is not None else None
    lat = lambda a, b: [x[3] for x in s.latencies if x[1] == "mixed" and x[2] == "short" and a <= x[0] <= b]
    lat_first, lat_last = lat(warm, warm + max(span * 0.25, 1)), lat(t_end - max(span * 0.25, 1), t_end)
    rows = [
        ("device MB", med(first, 2), med(last, 2), env_int("SOAK_MAX_DEVICE_MB", 64)),
        ("RSS MB", med(first, 3), med(last, 3), env_int("SOAK_MAX_RSS_MB", 128)),
        ("open fds", med(first, 4), med(last, 4), env_int("SOAK_MAX_FDS", 16)),
        ("threads", med(first, 5), med(last, 5), env_int("SOAK_MAX_THREADS", 8)),
    ]
    print(f"\n{'':18}{'start':>12}{'end':>12}{'growth':>12}{'allowed':>10}")
    failed = []
    for name, a, b, limit in rows:
        if a is None or b is None:
            print(f"{name:18}{'n/a':>12}{'n/a':>12}")
            continue
        grew = b - a
        print(f"{name:18}{a:12.1f}{b:12.1f}{grew:+12.1f}{limit:>10}")
        if grew > limit:
            failed.append(f"{name} grew by {grew:.1f} (allowed {limit})")
    for q in (0.5, 0.99):
        a, b = pct(lat_first, q), pct(lat_last, q)
        print(f"{'p%d short (s)' % (q * 100):18}{a:12.3f}{b:12.3f}{b - a:+12.3f}")
    print(f"\nrequests: {json.dumps(s.counts)}; failed: {len(s.errors)}")
    for e in s.errors[:10]:
        print(f"  {e}")
    if s.errors:
        failed.append(f"{len(s.errors)} requests failed")
    return failed


def main():
    host, port, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    minutes = float(sys.argv[4])
    s = Soak(host, port, pid)
    s.run(env_int("SOAK_SEQUENTIAL", 1000), minutes, env_int("SOAK_CLIENTS", 8), env_int("SOAK_SAMPLE_S", 5))
    failed = report(s, float(os.environ.get("SOAK_WARMUP", "0.2")))
    print("\nsoak: " + ("FAILED: " + "; ".join(failed) if failed else "passed: flat after warm-up"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

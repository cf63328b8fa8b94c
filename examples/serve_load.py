"""A small load generator for an OpenAI-style server (`max serve`): N concurrent
/v1/completions requests, then the client's view (latency, time to first token, tokens/s) and,
given the server's run directory, the serving loop's view from maxinstr's records of the same
span (batched prefill and decode steps, each request's queueing before its first step).

    maxinstr server start --profiler none -o runs/serve --ready 'Server ready' -- \\
        max serve --model-path runs/tiny-llama --devices cpu --quantization-encoding float32
    maxinstr server window runs/serve -- python examples/serve_load.py --requests 16 --concurrency 4
    python examples/serve_load.py --requests 16 --concurrency 4 --run-dir runs/serve   # or both views here
    maxinstr server stop runs/serve

Standard library only (threads and http.client). Every request asks for --max-tokens tokens with
ignore_eos, so each one makes exactly that many (a random model's EOS would otherwise end some
early); with --stream the time to first token is measured at the first streamed chunk.
Exit status 1 when a request failed (its error is printed).
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

PROMPTS = [
    "hello world",
    "the quick brown fox",
    "once upon a time there was",
    "a sampler picks the next token",
]


@dataclass
class Result:
    index: int
    start_ns: int  # time.monotonic_ns(): CLOCK_MONOTONIC, the clock of maxinstr's records
    end_ns: int = 0
    first_ns: int = 0  # first streamed chunk (with --stream)
    tokens: int = 0
    error: str = ""
    text: str = field(default="", repr=False)


def one_request(url: str, model: str, prompt: str, max_tokens: int, stream: bool, timeout_s: float, index: int) -> Result:
    parts = urlsplit(url)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                       "ignore_eos": True, "stream": stream}).encode()
    res = Result(index=index, start_ns=time.monotonic_ns())
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout_s)
    try:
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            res.error = f"HTTP {resp.status}: {resp.read(300).decode('utf-8', 'replace').strip()}"
            return res
        if stream:
            for raw in resp:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                if not res.first_ns:
                    res.first_ns = time.monotonic_ns()
                chunk = json.loads(line[5:])
                res.text += "".join(c.get("text", "") for c in chunk.get("choices", []))
                res.tokens += 1
        else:
            data = json.loads(resp.read())
            res.text = "".join(c.get("text", "") for c in data.get("choices", []))
            res.tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
    except (OSError, ValueError, http.client.HTTPException) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        res.end_ns = time.monotonic_ns()
        conn.close()
    return res


def run_load(url: str, model: str, requests: int, concurrency: int, max_tokens: int, stream: bool,
             timeout_s: float) -> list[Result]:
    """``requests`` requests, at most ``concurrency`` in flight (one thread each), prompts in turn."""
    results: list[Result | None] = [None] * requests
    next_index = iter(range(requests))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            results[i] = one_request(url, model, PROMPTS[i % len(PROMPTS)], max_tokens, stream, timeout_s, i)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, min(concurrency, requests)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.1f} ms"


def client_lines(results: list[Result], wall_ns: int) -> list[str]:
    ok = [r for r in results if not r.error]
    lat = sorted(r.end_ns - r.start_ns for r in ok)
    lines = [f"client: {len(ok)}/{len(results)} requests ok in {wall_ns / 1e9:.2f} s"]
    if lat:
        tokens = sum(r.tokens for r in ok)
        lines.append(f"  latency: median {_ms(lat[len(lat) // 2])}, p90 {_ms(lat[min(len(lat) - 1, int(0.9 * len(lat)))])}, "
                     f"max {_ms(lat[-1])}; {tokens} tokens, {tokens / (wall_ns / 1e9):.1f} tokens/s")
        ttft = sorted(r.first_ns - r.start_ns for r in ok if r.first_ns)
        if ttft:
            lines.append(f"  time to first token: median {_ms(ttft[len(ttft) // 2])}, max {_ms(ttft[-1])}")
    for r in results:
        if r.error:
            lines.append(f"  request {r.index}: {r.error}")
    return lines


def wait_ready(url: str, timeout_s: float) -> None:
    """Until GET /health answers 200 (max serve's), or raise SystemExit."""
    parts = urlsplit(url)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"serve_load: {url} did not answer /health within {timeout_s:g} s")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default: max serve's port 8000)")
    ap.add_argument("--model", default="", help="the model name in each request (default: the server's only model)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--stream", action="store_true", help="stream the completions (measures time to first token)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    ap.add_argument("--wait-ready", type=float, default=0.0, metavar="S", help="wait up to S seconds for /health first")
    ap.add_argument("--run-dir", default=None, help="the server's run directory: print the serving loop over this load")
    a = ap.parse_args(argv)
    for name in ("requests", "concurrency", "max_tokens"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.wait_ready:
        wait_ready(a.url, a.wait_ready)
    model = a.model or _served_model(a.url)
    t0 = time.monotonic_ns()
    results = run_load(a.url, model, a.requests, a.concurrency, a.max_tokens, a.stream, a.timeout)
    t1 = time.monotonic_ns()
    for line in client_lines(results, t1 - t0):
        print(line)
    if a.run_dir:
        from maxinstr.cli.server import serving_lines

        time.sleep(0.5)  # the server's writers flush every few ms; leave them a moment
        for line in serving_lines(a.run_dir, t0, t1):
            print(line)
    return 1 if any(r.error for r in results) else 0


def _served_model(url: str) -> str:
    """The first model GET /v1/models lists ('' when it lists none or cannot be asked)."""
    parts = urlsplit(url)
    try:
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=10)
        conn.request("GET", "/v1/models")
        data = json.loads(conn.getresponse().read())
        return str(data["data"][0]["id"])
    except (OSError, ValueError, KeyError, IndexError, TypeError, http.client.HTTPException):
        return ""


if __name__ == "__main__":
    sys.exit(main())

"""How long `session.close()` (and the process's exit) takes while another thread keeps
recording stages, with and without an int attr (issue 29, point 6: 20-40 s with an attr, 0.24 s
without; target: bounded, about 1 s, whatever the other thread does), and what the run kept.

    python benchmarks/close_under_load.py [--rounds 3] [--record-s 1.0] [--baseline-src /tmp/old/src]

Each measurement is a fresh process: a session opens, a thread records stages in a loop (with
``n=i`` or without attrs) for ``--record-s`` seconds, then the main thread closes the session
(``close``) or returns from main with the session still open (``exit``: the atexit path), the
recording thread still running. The child prints the close time; the parent reads the run back
(records, attrs, and every loss the notes say). ``--baseline-src`` runs the same with an older
source tree first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from harness import emit_result, load_average, print_table, run_child

CHILD = textwrap.dedent("""
    import json, os, sys, threading, time
    import maxinstr
    run, mode, attrs, record_s = sys.argv[1], sys.argv[2], sys.argv[3] == "1", float(sys.argv[4])
    stop = False
    def spin():
        i = 0
        while not stop:
            if attrs:
                with maxinstr.stage("bg", n=i):
                    pass
            else:
                with maxinstr.stage("bg"):
                    pass
            i += 1
    s = maxinstr.session(run, sample_hz=0)
    s.__enter__()
    threading.Thread(target=spin, daemon=True).start()
    time.sleep(record_s)
    t0 = time.perf_counter()
    if mode == "close":
        s.__exit__(None, None, None)
        print("RESULT " + json.dumps({"close_s": time.perf_counter() - t0}), flush=True)
    else:  # leave with the session open: maxinstr's exit hook closes it; the parent times the rest
        print("RESULT " + json.dumps({"main_done_unix": time.time()}), flush=True)
""")

READ = textwrap.dedent("""
    import json, sys
    import maxinstr
    r = maxinstr.load(sys.argv[1])
    print("RESULT " + json.dumps({"records": len(r), "attrs": len(r.attrs),
                                  "losses": [n for n in r.notes if "attrs" in n or "dropped" in n]}))
""")


def one(tmp: Path, mode: str, attrs: bool, record_s: float, src: str | None, k: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAXINSTR_")}
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    run = tmp / f"run-{k}"
    child = run_child([sys.executable, "-c", CHILD, str(run), mode, "1" if attrs else "0", str(record_s)],
                      limit_s=180, env=env)
    ended = time.time()
    res = dict(child.result or {})
    if "main_done_unix" in res:
        res["close_s"] = ended - res.pop("main_done_unix")  # exit: main's end to the process's end
    res["wall_s"] = child.wall_s
    read = run_child([sys.executable, "-c", READ, str(run)], limit_s=300, env=env)
    res.update(read.result or {"records": None, "attrs": None, "losses": [read.stderr.strip()[-120:]]})
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--record-s", type=float, default=1.0)
    ap.add_argument("--baseline-src", default=None)
    a = ap.parse_args()
    print(load_average())
    rows = []
    k = 0
    with tempfile.TemporaryDirectory(prefix="maxinstr-close-") as tmp:
        for r in range(a.rounds):
            for code, src in (("this", None), ("baseline", a.baseline_src)):
                if code == "baseline" and not src:
                    continue
                for mode in ("close", "exit"):
                    for attrs in (True, False):
                        k += 1
                        res = one(Path(tmp), mode, attrs, a.record_s, src, k)
                        row = [code, mode, "n=i" if attrs else "none", r, res.get("close_s"), res.get("wall_s"),
                               res.get("records"), res.get("attrs"), "; ".join(res.get("losses") or [])[:150]]
                        rows.append(row)
                        print_table(["code", "path", "attrs", "round", "close s", "process s", "records", "with attrs",
                                     "losses said"], [row], [None, None, None, None, ".2f", ".2f"])
        emit_result({"rows": rows})


if __name__ == "__main__":
    main()

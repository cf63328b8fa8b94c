"""Server path: a tiny real HTTP server under the fake `nsys launch`, one capture window
around a real benchmark client, then shutdown; and the ways starting can fail."""
from __future__ import annotations

import pytest

import json
import socket
import sys
import time
from pathlib import Path

from _launch_helpers import base_env, run_cli

SERVER = """
import http.server, socketserver, sys, time
port = int(sys.argv[1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
time.sleep(0.3)  # loading the model
socketserver.TCPServer.allow_reuse_address = True
with socketserver.TCPServer(("127.0.0.1", port), H) as s:
    print(f"Server ready on {port}", flush=True)
    s.serve_forever()
"""
BENCH = """
import sys, urllib.request
port, n = int(sys.argv[1]), int(sys.argv[2])
ok = sum(urllib.request.urlopen(f"http://127.0.0.1:{port}/").read() == b"ok" for _ in range(n))
print(f"bench: {ok}/{n} ok", flush=True)
sys.exit(0 if ok == n else 1)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pid_gone(pid: int, within_s: float = 10) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_start_window_stop(tmp_path, script):
    server, bench = script("server.py", SERVER), script("bench.py", BENCH)
    port, out = _free_port(), tmp_path / "serve"
    env = base_env(FAKE_NSYS_STATE=str(tmp_path / "nsys-state"), FAKE_NSYS_LOG=str(tmp_path / "nsys.jsonl"))
    res = run_cli(["server", "start", "-o", str(out), "--ready", "Server ready", "--", sys.executable, str(server), str(port)], env)
    assert res.returncode == 0, res.stderr
    state = json.loads((out / "server.json").read_text())
    # Nothing is collected while the server loads: launched, not profiled.
    calls = [json.loads(line)["argv"] for line in (tmp_path / "nsys.jsonl").read_text().splitlines()]
    assert [c[0] for c in calls if c[0] != "--version"] == ["launch"]
    assert calls[-1][1] == f"--session-new={state['session']}" and calls[-1][-3:] == [sys.executable, str(server), str(port)]

    res = run_cli(["server", "window", str(out), "--", sys.executable, str(bench), str(port), "25"], env)
    assert res.returncode == 0, res.stderr
    assert "bench: 25/25 ok" in res.stdout
    assert (out / "window-1.nsys-rep").exists() and (out / "window-1.sqlite").exists()
    calls = [json.loads(line)["argv"] for line in (tmp_path / "nsys.jsonl").read_text().splitlines()]
    verbs = [c[0] for c in calls if c[0] != "--version"]
    assert verbs[:4] == ["launch", "start", "stop", "export"]
    start = calls[[c[0] for c in calls].index("start")]
    assert f"--output={out.resolve()}/window-1" in start
    launch = calls[[c[0] for c in calls].index("launch")]
    # nsys refuses --sample and --cpuctxsw on launch (seen on the H200): they go on start
    assert not any(a.startswith(("--cpuctxsw", "--sample")) for a in launch)
    assert "--sample=none" in start and "--cpuctxsw=none" in start

    res = run_cli(["server", "window", str(out), "--duration", "0.2"], env)  # a second window, timed
    assert res.returncode == 0, res.stderr
    assert (out / "window-2.sqlite").exists()

    res = run_cli(["server", "stop", str(out)], env)
    assert res.returncode == 0, res.stderr
    assert "2 window(s)" in res.stderr
    assert _pid_gone(state["pid"])
    with socket.socket() as s:  # nobody listens on the port any more: the server is really gone
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
    windows = json.loads((out / "server.json").read_text())["windows"]
    assert [w["artifact"]["ok"] for w in windows] == [True, True] and windows[0]["bench_status"] == "ok"
    # The server's own run directory was written by its session (bootstrap).
    assert (out / "meta.json").exists()


def test_server_run_all_in_one_without_profiler(tmp_path, script):
    server, bench = script("server.py", SERVER), script("bench.py", BENCH)
    port, out = _free_port(), tmp_path / "s"
    res = run_cli(["server", "run", "-o", str(out), "--profiler", "none", "--ready", "Server ready",
                   "--bench", f"{sys.executable} {bench} {port} 5", "--", sys.executable, str(server), str(port)], base_env())
    assert res.returncode == 0, res.stderr
    assert "bench: 5/5 ok" in res.stdout and "server stopped" in res.stderr
    assert _pid_gone(json.loads((out / "server.json").read_text())["pid"])


def test_server_that_dies_while_starting_is_reported_at_once(tmp_path, script):
    server = script("bad.py", "import sys\nprint('loading', flush=True)\nsys.exit(3)\n")
    t0 = time.monotonic()
    res = run_cli(["server", "start", "-o", str(tmp_path / "s"), "--profiler", "none", "--ready", "never", "--",
                   sys.executable, str(server)], base_env())
    assert res.returncode == 2 and time.monotonic() - t0 < 20
    assert "the server exited before it was ready" in res.stderr and "loading" in res.stderr


def test_server_that_never_gets_ready_is_stopped(tmp_path, script):
    server = script("slow.py", "import time\nprint('loading', flush=True)\ntime.sleep(120)\n")
    res = run_cli(["server", "start", "-o", str(tmp_path / "s"), "--profiler", "none", "--ready", "Server ready",
                   "--ready-timeout", "1", "--", sys.executable, str(server)], base_env())
    assert res.returncode == 2 and "did not log /Server ready/ within 1 s" in res.stderr
    assert _pid_gone(json.loads((tmp_path / "s" / "server.json").read_text())["pid"])


def test_fatal_log_while_starting_stops_the_server(tmp_path, script):
    server = script("oom.py", "import time\nprint('RuntimeError: CUDA out of memory', flush=True)\ntime.sleep(120)\n")
    res = run_cli(["server", "start", "-o", str(tmp_path / "s"), "--profiler", "none", "--ready", "ready",
                   "--", sys.executable, str(server)], base_env())
    assert res.returncode == 2 and "server stopped: out of GPU memory" in res.stderr
    assert _pid_gone(json.loads((tmp_path / "s" / "server.json").read_text())["pid"])


def test_a_second_server_on_the_same_run_directory_replaces_the_first(tmp_path, script):
    # the earlier server's log said "Server ready": the new one must not be taken as ready by it,
    # and the earlier server's parts must not merge with the new server's records
    server = script("server.py", SERVER.replace("time.sleep(0.3)", "import maxinstr; maxinstr.mark('up'); time.sleep(2)"))
    out = tmp_path / "serve"
    env = base_env()
    for _ in range(2):
        port = _free_port()
        res = run_cli(["server", "start", "--profiler", "none", "-o", str(out), "--ready", "Server ready", "--",
                       sys.executable, str(server), str(port)], env)
        assert res.returncode == 0, res.stderr
        # start returned on this server's own line (it prints it 2 s in), not the earlier one's
        assert f"Server ready on {port}" in (out / "server.log").read_text()
        pid = json.loads((out / "server.json").read_text())["pid"]
        assert run_cli(["server", "stop", str(out)], env).returncode == 0
    import maxinstr

    run = maxinstr.load(out)
    assert [p["pid"] for p in run.parts] == [pid] and list(run.stage_names()) == ["up"]
    assert (out / "server.log").read_text().count("Server ready") == 1

"""The HTML report in a real headless browser (Debian's chromium): it renders, the plots are
in the live DOM with their data, no console error, and a screenshot is kept.

Skips (with the reason) when no chromium is installed. Screenshots and the DOM dumps go to
``$MAXINSTR_ARTIFACTS/html`` when that is set, else to pytest's tmp dir; the path is printed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from maxinstr.analyze.report import analyze
from maxinstr.render import html as rhtml
from views_data import DATA, recorded_run

pytestmark = [pytest.mark.browser, pytest.mark.slow]

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CONSOLE_ERROR = re.compile(r":CONSOLE[:(]|Uncaught")
"""Chromium logs every console message of the page as ``INFO:CONSOLE:<line>`` (errors too); the
report has no script, so any console line is a failure."""
# Chromium's own noise on a box without D-Bus/GPU: not about the page
NOISE = re.compile(r"dbus|D-Bus|vaapi|drmGetDevices|sandbox|gpu_init|viz_main|gl_surface|angle|fontconfig|"
                   r"Fontconfig|GetVSyncParametersIfAvailable|ScreenSaver|gcm|power_save_blocker|bus\.cc", re.I)


def _browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no chromium on this machine (apt-get install -y chromium)")


def _artifacts(tmp_path: Path) -> Path:
    root = os.environ.get("MAXINSTR_ARTIFACTS")
    out = Path(root) / "html" if root else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    return out


def _chromium(args: list[str], page: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    cmd = [_browser(), "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars", "--mute-audio",
           "--no-first-run", "--disable-extensions", f"--user-data-dir={tmp_path / 'profile'}",
           "--enable-logging=stderr", "--v=0", "--virtual-time-budget=3000", *args, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _page_errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if CONSOLE_ERROR.search(ln) and not NOISE.search(ln)]


def _check(doc: str, name: str, tmp_path: Path, height: int) -> tuple[str, Path]:
    out = _artifacts(tmp_path)
    page = out / f"{name}.html"
    page.write_text(doc)
    shot = out / f"{name}.png"
    res = _chromium([f"--window-size=1280,{height}", f"--screenshot={shot}"], page, tmp_path)
    assert shot.exists() and shot.stat().st_size > 20_000, res.stderr[-2000:]
    assert _page_errors(res.stderr) == []
    dom = _chromium(["--dump-dom"], page, tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert _page_errors(dom.stderr) == []
    (out / f"{name}.dom.html").write_text(dom.stdout)
    print(f"\nscreenshot: {shot}")
    return dom.stdout, shot


def test_console_errors_are_caught(tmp_path):
    # the check itself: a page that throws must be reported
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>console.error('boom'); notDefined();</script></body></html>")
    res = _chromium(["--dump-dom"], page, tmp_path)
    errors = _page_errors(res.stderr)
    assert any("boom" in e for e in errors) and any("Uncaught ReferenceError" in e for e in errors)


def test_decode_trace_report_renders(tmp_path):
    _browser()
    a = analyze(trace=str(DATA / "nsys" / "h200_decode.sqlite"))
    dom, _ = _check(rhtml.render(a.report, analysis=a), "h200_decode", tmp_path, 3700)
    # the browser built the plots: every SVG, with its bars, strips and series
    assert dom.count("<svg") >= 6
    assert 'aria-label="per-stage time breakdown"' in dom and 'aria-label="GPU metrics over time with stage bands"' in dom
    assert len(re.findall(r'<rect[^>]*class="fam"', dom)) >= 10  # kernel-family segments
    assert re.search(r'<polygon class="series" data-points="\d{2,}"', dom)
    assert "Facts (measured)" in dom and "launch_bound" in dom


def test_run_with_samples_renders(tmp_path, monkeypatch):
    _browser()
    run = recorded_run(tmp_path / "run", monkeypatch)
    a = analyze(run=str(run))
    dom, _ = _check(rhtml.render(a.report, analysis=a), "run_with_samples", tmp_path, 2600)
    points = [int(n) for n in re.findall(r'<polyline class="series" data-points="(\d+)"', dom)]
    assert len(points) >= 5 and max(points) > 100  # util / SM / tensor / power / memory lines

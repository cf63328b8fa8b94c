"""``.nsys-rep`` -> SQLite, in ``nsys stats``'s order: ``NAME.sqlite`` beside the report when it is not
older than the report; else ``nsys export`` beside it when that folder is writable, or into a per-user
cache keyed by the report's path, size and mtime; else a TraceError saying how to get the SQLite (an
export older than the report may be of another capture: never read in its place).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from maxinstr.errors import TraceError
from maxinstr.traces._util import TempCleanup

HOW = (
    "maxinstr reads the SQLite export of an Nsight Systems report: install Nsight Systems so that "
    "`nsys` is on PATH, or run `nsys export --type sqlite -o {stem}.sqlite {name}` where nsys is "
    "and pass the .sqlite"
)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = Path(base) / "maxinstr" / "nsys-sqlite"
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError:
        path = Path(tempfile.gettempdir()) / f"maxinstr-nsys-sqlite-{os.getuid()}"
        path.mkdir(parents=True, exist_ok=True)
        return path


def sqlite_for_report(report: str | Path, *, nsys: str | None = None, timeout_s: float = 600.0) -> tuple[Path, str]:
    """The SQLite export of ``report`` (exporting it with nsys when needed), and a note saying which it is."""
    report = Path(report)
    if not report.is_file():
        raise TraceError(report, "no such file")
    beside = report.with_suffix(".sqlite")
    stat = report.stat()
    exe = nsys or shutil.which("nsys")
    if beside.is_file() and beside.stat().st_mtime_ns >= stat.st_mtime_ns:
        return beside, f"read from the SQLite export beside it, {beside} (not older than the .nsys-rep)"
    if exe is None:
        if beside.is_file():
            raise TraceError(report, f"the SQLite export beside it, {beside}, is older than the report (an export of "
                                     "another capture?) and nsys is not on PATH to export again: run `nsys export "
                                     f"--type sqlite --force-overwrite true -o {beside.name} {report.name}` where nsys "
                                     f"is, or delete it; `touch {beside.name}` if it is this report's export")
        raise TraceError(report, "nsys is not on PATH: " + HOW.format(stem=report.stem, name=report.name))
    if os.access(report.parent, os.W_OK):
        target = beside
    else:
        key = hashlib.sha1(f"{report.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        target = _cache_dir() / f"{report.stem}-{key}.sqlite"
        if target.is_file():
            return target, f"read from its SQLite export {target} (made earlier by nsys export)"
    # a folder of our own beside the target (random name, created exclusively): nsys writes its
    # export there, never through a link planted at a guessable name; removed on every way out
    # (SIGTERM and SIGHUP included) but SIGKILL
    tmpdir = tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    cleanup = TempCleanup(tmpdir)
    tmp = Path(tmpdir) / f"{target.stem}.sqlite"
    cmd = [exe, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", str(tmp), str(report)]
    try:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TraceError(report, f"`nsys export` failed to run ({exc}): " + HOW.format(stem=report.stem, name=report.name)) from None
        if done.returncode != 0 or not tmp.is_file():
            tail = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or ["no output"]
            raise TraceError(report, f"`nsys export --type sqlite` exited {done.returncode}: {tail[0]}")
        os.replace(tmp, target)  # atomic: a reader never sees half an export
    finally:
        cleanup.close()
    return target, f"exported to SQLite by nsys export: {target}"

"""`maxinstr snapshot`: is my GPU being used? Watch the GPUs for a while (or while a command
runs) and print, per GPU, utilization, SM activity, memory, power, throttling and a verdict."""

from __future__ import annotations

import json
import math
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from maxinstr._text import visible
from maxinstr.cli import Seconds, UserError

# rich, and the sampler's summary and readers (~35 ms of imports with numpy loaded), are imported
# where they are used: `maxinstr --help` imports this module


def _fmt_pct(mean: float, peak: float) -> str:
    return f"{mean:.0f}/{peak:.0f}" if math.isfinite(mean) else "-"


def _fmt_gib(x: float) -> str:
    return f"{x / 2**30:.1f}" if math.isfinite(x) else "-"


def render(summaries: list, meta: dict[str, Any], console) -> None:
    """The rich table (rendering only; numbers from maxinstr.sample.summary)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from maxinstr.rundir.samples import THROTTLE_BITS
    from maxinstr.sample.summary import THRESHOLDS

    groups = dict(THROTTLE_BITS)
    table = Table(title="GPU snapshot (mean/peak over the active window)", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("GPU", overflow="ellipsis", no_wrap=True, min_width=5)  # full name in the line below
    for col in ("util\n%", "SM act\n%", "mem GiB\npeak/total", "power\nW"):
        table.add_column(col, justify="right", no_wrap=True)
    # power cap apart from thermal/HW slowdown: a loaded GPU at its power limit is power-bound
    # (the driver lowers clocks to stay under it), not overheating or faulty
    table.add_column("power\ncap", justify="right", no_wrap=True)
    table.add_column("thermal/\nHW slow", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    styles = {"busy": "green", "idle": "dim", "host-bound": "yellow", "launch/sync-bound": "yellow", "unknown": "dim"}
    for s in summaries:
        reasons = []
        for name, pct in sorted(s.throttle_pct.items(), key=lambda kv: -kv[1]):
            label = f"{name} {pct:.0f}%"
            reasons.append(f"[bold red]{label}[/]" if groups.get(name) == "thermal_hw" else label)
        s._reasons = ", ".join(reasons) or "none"
        table.add_row(
            Text(visible(f"{s.visible_index} {s.name}")),  # a device name is data, not markup
            _fmt_pct(s.util_mean_pct, s.util_peak_pct),
            _fmt_pct(s.sm_active_mean_pct, s.sm_active_peak_pct) if math.isfinite(s.sm_active_mean_pct) else "n/a",
            f"{_fmt_gib(s.mem_used_peak_bytes)}/{_fmt_gib(s.mem_total_bytes)}",
            _fmt_pct(s.power_mean_w, s.power_peak_w),
            f"{s.power_cap_pct:.0f}%" if s.power_cap_pct else "none",
            f"[bold red]{s.thermal_hw_pct:.0f}%[/]" if s.thermal_hw_pct else "none",
            f"[{styles[s.verdict]}]{s.verdict}[/]",
        )
    console.print(table)
    for s in summaries:
        console.print(Text.assemble(
            f"GPU {s.visible_index} (", visible(s.name), "): ", (s.verdict, styles[s.verdict]), f": {s.why}; ",
            "clock limits (% of samples): ", Text.from_markup(s._reasons),
            f"; {s.samples} samples, active {s.active_s:.1f} of {s.window_s:.1f} s"))
    console.print("thresholds: " + "; ".join(f"{k}: {v}" for k, v in THRESHOLDS.items()), style="dim")
    console.print("power cap: the driver lowers clocks to stay under the board's power limit (sw_power_cap; "
                  "usual under full load: power-bound, not a fault). thermal/HW slowdown (red): heat, power "
                  "brake or current limit. Both are told apart from idle and from clock settings (app_clocks, "
                  "user_clocks, sync_boost, display_clocks).", style="dim")
    for e in meta.get("errors", [])[:10]:
        console.print(Text(f"note: {visible(e['message'])}", style="dim"))


@click.command("snapshot", context_settings={"ignore_unknown_options": True})
@click.option("--duration", type=Seconds(), default=None,
              help="Seconds to watch (default 5 without a command; with one: until it ends).")
@click.option("--interval", type=Seconds(), default=0.05, show_default=True, help="Seconds between samples.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON instead of a table.")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def command(duration: float | None, interval: float, as_json: bool, cmd: tuple[str, ...]) -> None:
    """Watch the GPUs and say whether they are used: idle, host-bound, launch/sync-bound or busy.

    \b
    maxinstr snapshot --duration 10
    maxinstr snapshot -- python train.py      (exits with the command's status)
    """
    from rich.console import Console

    from maxinstr.sample import read_samples, start_sampler
    from maxinstr.sample.summary import summarize

    # the table goes to stderr when a command runs, so its stdout stays the command's own
    console = Console(stderr=bool(cmd))
    with tempfile.TemporaryDirectory(prefix="maxinstr-snapshot-") as tmp:
        child: subprocess.Popen | None = None
        # Is there a GPU to watch? Asked before the command starts. Without one, a command still
        # runs (unwatched, said in one line) and its status is ours, as the help promises.
        probe = start_sampler(Path(tmp) / "probe", interval, pids=[], mode="auto")
        reason = probe.unavailable or (None if probe.devices else "no visible GPU")
        probe.stop()
        if reason and not cmd:
            raise UserError(f"no GPU to watch ({reason})")
        if reason:
            click.echo(f"maxinstr: no GPU to watch ({reason}); running {cmd[0]} unwatched", err=True)
            try:
                code = subprocess.call(list(cmd))
            except OSError as exc:
                raise UserError(f"cannot run {cmd[0]}: {exc.strerror or exc}") from None
            raise click.exceptions.Exit(128 - code if code < 0 else code)
        if cmd:
            try:
                child = subprocess.Popen(list(cmd))
            except OSError as exc:
                raise UserError(f"cannot run {cmd[0]}: {exc.strerror or exc}") from None
        # a thread here: this process runs no user code, and a thread starts sampling at once
        sampler = start_sampler(tmp, interval, pids=[child.pid] if child else [], mode="auto")
        if sampler.unavailable or not sampler.devices:  # the GPU went away since the probe: say so, let it run
            sampler.stop()
            code = child.wait() if child is not None else 0
            click.echo(f"maxinstr snapshot: no GPU to watch ({sampler.unavailable or 'no visible GPU'})", err=True)
            raise click.exceptions.Exit(128 - code if code < 0 else code)
        code = 0
        try:
            if child is None:
                time.sleep(5.0 if duration is None else duration)
            else:
                deadline = None if duration is None else time.monotonic() + duration
                while child.poll() is None:
                    if deadline is not None and time.monotonic() >= deadline and sampler.running:
                        sampler.stop()  # watched long enough; the command goes on
                    time.sleep(0.05)
        except KeyboardInterrupt:
            pass  # Ctrl-C reached the command too (same process group); summarize what we have
        finally:
            sampler.stop()
            if child is not None:
                try:
                    code = child.wait()
                except KeyboardInterrupt:
                    child.kill()
                    code = child.wait()
        samples = read_samples(tmp)
    summaries = summarize(samples)
    if as_json:
        doc = {"gpus": [s.to_json() for s in summaries], "errors": samples.errors,
               "backend": samples.meta.get("backend"), "interval_s": interval}
        click.echo(json.dumps(doc, indent=1), err=bool(cmd))
    else:
        render(summaries, samples.meta, console)
    if code:
        # a command killed by a signal exits like a shell reports it: 128 + signal number
        raise click.exceptions.Exit(128 - code if code < 0 else code)

"""Named presets of ``--stage`` wrap points for a framework's own code (``--preset max``, by itself for MAX's
commands; ``--no-preset`` not): they travel to every process as ``--stage`` specs do."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from maxinstr.errors import MaxinstrError
from maxinstr.integrations import max_pipeline


@dataclass(frozen=True)
class Preset:
    name: str
    specs: tuple[str, ...]
    env: Mapping[str, str]  # set in the program's environment unless the user set it (why: in the docs)
    what: str
    applies_to: str  # the commands that get it without --preset

    def plan_line(self) -> str:
        env = "".join(f", {k}={v}" for k, v in self.env.items())
        return f"preset {self.name}: {len(self.specs)} wrap points in {self.what}{env} (by itself for {self.applies_to}; --no-preset: not)"


PRESETS: dict[str, Preset] = {
    # telemetry off: no telemetry process or threads beside the program measured, nothing sent out
    "max": Preset(name="max", specs=tuple(p.spec for p in max_pipeline.WRAP_POINTS), env={max_pipeline.TELEMETRY_VARIABLE: "1"},
                  what=f"MAX {max_pipeline.MAX_RELEASE}'s pipelines (tokenize, prefill, decode, forward, sample, graph, load, compile)",
                  applies_to="MAX's commands")}


def preset(name: str) -> Preset:  # MaxinstrError naming the known ones when there is no such preset
    try:
        return PRESETS[name]
    except KeyError:
        raise MaxinstrError(f"--preset {name!r}: no such preset (known: {', '.join(sorted(PRESETS))})") from None


def recorded_specs(launch: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """``(--stage specs given, presets)`` of a run's launch.json, to run it again: a preset counts only
    where all its specs were recorded (``stage_specs`` holds them too)."""
    recorded = {t for t in (launch.get("stage_specs") or []) if isinstance(t, str)}
    names = [n for n in (launch.get("presets") or []) if isinstance(n, str) and n in PRESETS
             and set(PRESETS[n].specs) <= recorded]
    from_presets = {text for name in names for text in PRESETS[name].specs}
    return [t for t in (launch.get("stage_specs") or []) if isinstance(t, str) and t not in from_presets], names


def auto_presets(command: Sequence[str]) -> list[str]:  # the presets a command gets without asking
    return ["max"] if max_pipeline.is_max_command(command) else []

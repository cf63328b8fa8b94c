"""Read a part's samples back as numpy columns (for ``maxinstr.load``, reports, snapshot).

The row layout comes from samples.json (so older or newer writers stay readable); a torn
last row (process killed mid-write) is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from maxinstr._files import parse_json, read_regular
from maxinstr.errors import RunDirError
from maxinstr.sample.base import FLAG_GPM, FLAG_LOST, FLAG_SLOW, HW_THROTTLE_MASK, IDLE_MASK, SETTING_MASK
from maxinstr.sample.writer import SAMPLES_BIN, SAMPLES_JSON

_HEADER_FIELDS = ("t_ns", "device", "flags", "read_ns", "throttle", "throttle_raw")


@dataclass(repr=False)
class Samples:
    """Sampler rows of one part, one row per (tick, device), in time order per device.

    ``rows`` is the structured array (fields named in ``meta['row']``); the common columns
    are exposed as attributes. Float metrics are NaN where absent or not read in that row.
    ``devices`` is samples.json's device list (``device`` indexes it).
    """

    rows: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    torn_bytes: int = 0

    @property
    def t_ns(self) -> np.ndarray:
        return self.rows["t_ns"]

    @property
    def device(self) -> np.ndarray:
        return self.rows["device"]

    @property
    def flags(self) -> np.ndarray:
        return self.rows["flags"]

    @property
    def throttle(self) -> np.ndarray:
        return self.rows["throttle"]

    @property
    def devices(self) -> list[dict[str, Any]]:
        return list(self.meta.get("devices", []))

    @property
    def metric_names(self) -> list[str]:
        return [f["name"] for f in self.meta.get("row", {}).get("fields", []) if f["name"] not in _HEADER_FIELDS]

    @property
    def units(self) -> dict[str, str]:
        return {f["name"]: f.get("unit", "") for f in self.meta.get("row", {}).get("fields", [])}

    @property
    def errors(self) -> list[dict[str, Any]]:
        return list(self.meta.get("errors", []))

    @property
    def unavailable(self) -> str | None:
        return self.meta.get("unavailable")

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        names = [f"{d.get('visible_index')}:{d.get('name')}" for d in self.devices]
        why = f", unavailable={self.unavailable!r}" if self.unavailable else ""
        return f"Samples({len(self)} rows, devices={names}, backend={self.meta.get('backend')!r}{why})"

    def column(self, name: str) -> np.ndarray:
        """One metric column (float, NaN where absent)."""
        return self.rows[name]

    def for_device(self, device: int) -> Samples:
        """Only the rows of ``device`` (an index into ``devices``), in time order."""
        rows = self.rows[self.rows["device"] == device]
        order = np.argsort(rows["t_ns"], kind="stable")
        return Samples(rows[order], self.meta, 0)

    def hw_throttled(self) -> np.ndarray:
        """Per row: hardware/firmware throttling (not idle, not a clock setting) was seen."""
        return (self.rows["throttle"] & HW_THROTTLE_MASK) != 0

    def idle(self) -> np.ndarray:
        return (self.rows["throttle"] & IDLE_MASK) != 0

    def setting_limited(self) -> np.ndarray:
        return (self.rows["throttle"] & SETTING_MASK) != 0


def dtype_from_layout(layout: dict[str, Any], where: Path) -> np.dtype:
    """The numpy dtype of a samples.bin row described in samples.json."""
    try:
        dtype = np.dtype([(f["name"], f["type"]) for f in layout["fields"]])
        size = int(layout["size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise RunDirError(where, f"bad row layout in {SAMPLES_JSON}: {exc}") from None
    if dtype.itemsize != size:
        raise RunDirError(where, f"{SAMPLES_JSON} says rows are {size} bytes but its fields add up to {dtype.itemsize}")
    # the columns every reader uses (a layout without t_ns, or with it as text, was a
    # ValueError from inside the HTML view); metrics may come and go
    for name, kind in (("t_ns", "i"), ("device", "iu"), ("flags", "iu"), ("throttle", "iu")):
        if name not in (dtype.names or ()) or dtype[name].kind not in kind:
            raise RunDirError(where, f"bad row layout in {SAMPLES_JSON}: no integer field {name!r}")
    metrics = [n for n in dtype.names or () if n not in _HEADER_FIELDS]
    bad = next((n for n in metrics if dtype[n].kind not in "fiu" or dtype[n].shape), None)
    if bad is not None:
        raise RunDirError(where, f"bad row layout in {SAMPLES_JSON}: field {bad!r} is not a number")
    return dtype


def _clip(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_samples(part_dir: Path | str) -> Samples:
    """The samples in ``part_dir``. No samples.json and no samples.bin: an empty result (the
    sampler never ran). A samples.bin without samples.json, or a malformed samples.json:
    :class:`~maxinstr.errors.RunDirError`."""
    part = Path(part_dir)
    meta_path, bin_path = part / SAMPLES_JSON, part / SAMPLES_BIN
    text = read_regular(meta_path, RunDirError)  # never a FIFO or a device: those hang or never end
    data = read_regular(bin_path, RunDirError)
    if text is None:
        if data:
            raise RunDirError(bin_path, f"has no {SAMPLES_JSON} beside it: the row layout is unknown")
        return Samples(np.empty(0, dtype=[("t_ns", "<i8"), ("device", "<u2"), ("flags", "<u2"), ("throttle", "<u4")]))
    meta = parse_json(text, meta_path, RunDirError)
    if not isinstance(meta, dict) or meta.get("format") != "maxinstr-samples":
        raise RunDirError(meta_path, "is not a maxinstr samples description")
    version = meta.get("version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise RunDirError(meta_path, f"samples format version {_clip(version)} is not a number")
    if version > 1:
        raise RunDirError(meta_path, f"samples format version {version} is newer than this maxinstr reads (1)")
    for key, ok, what in (("devices", lambda v: isinstance(v, list) and all(isinstance(d, dict) for d in v), "a list of objects"),
                          ("errors", lambda v: isinstance(v, list) and all(isinstance(d, dict) for d in v), "a list of objects"),
                          ("unavailable", lambda v: isinstance(v, str), "a string"),
                          ("row", lambda v: isinstance(v, dict), "an object")):
        if meta.get(key) is not None and not ok(meta[key]):
            raise RunDirError(meta_path, f'"{key}" is not {what}: {_clip(meta[key])}')
    dtype = dtype_from_layout(meta.get("row") or {}, meta_path)
    raw = np.frombuffer(bytearray(data or b""), dtype=np.uint8)  # writable, as the rows were from np.fromfile
    n = len(raw) // dtype.itemsize
    torn = len(raw) - n * dtype.itemsize
    rows = raw[: n * dtype.itemsize].view(dtype) if n else np.empty(0, dtype=dtype)
    return Samples(rows, meta, torn)


__all__ = ["FLAG_GPM", "FLAG_LOST", "FLAG_SLOW", "Samples", "dtype_from_layout", "read_samples"]

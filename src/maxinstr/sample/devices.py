"""Which GPUs a program sees, so rows carry its framework's index (``cuda:0``) and only its GPUs
are sampled. The CUDA and ROCm runtimes' rules: unset, every GPU; empty, none; a list of indices,
``GPU-<uuid>`` (a unique prefix), ``MIG-<uuid>`` or ``MIG-GPU-<uuid>/<gi>/<ci>`` that ends at the
first entry invalid, out of range, ambiguous or repeated; on AMD, ROCR filters first and HIP (or
CUDA) indexes into what it left. NVML and amdsmi enumerate in PCI bus order, CUDA only with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``: a note says so when the orders may differ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


def _norm(uuid: str) -> str:
    return uuid.strip().lower()


@dataclass(frozen=True)
class MigInstance:  # as NVML enumerates it
    uuid: str  # "MIG-xxxxxxxx-..."
    gpu_instance_id: int = -1
    compute_instance_id: int = -1
    index: int = 0  # NVML's MIG device index on its parent


@dataclass(frozen=True)
class PhysicalGpu:  # as the vendor library enumerates it
    index: int
    uuid: str
    name: str = ""
    mig: tuple[MigInstance, ...] = ()


@dataclass(frozen=True)
class VisibleGpu:  # a GPU (or MIG instance) the program sees
    visible_index: int
    physical_index: int
    uuid: str
    mig: MigInstance | None = None


@dataclass
class Visibility:  # visible GPUs in visible order, the variable used, and notes
    gpus: list[VisibleGpu]
    source: str  # e.g. "CUDA_VISIBLE_DEVICES=1,0" or "all"
    notes: list[str] = field(default_factory=list)


def _match_uuid(token: str, gpus: Sequence[PhysicalGpu]) -> tuple[PhysicalGpu, MigInstance | None] | str:
    """Find the GPU or MIG instance a UUID token names; a string is the reason it fails."""
    t = _norm(token)
    if t.startswith("mig-gpu-"):  # legacy MIG-GPU-<uuid>/<gi>/<ci>
        parts = t[len("mig-"):].split("/")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            return f"malformed MIG id {token!r}"
        gi, ci = int(parts[1]), int(parts[2])
        for g in gpus:
            if _norm(g.uuid) == parts[0]:
                for m in g.mig:
                    if m.gpu_instance_id == gi and m.compute_instance_id == ci:
                        return g, m
        return f"no MIG instance {token!r}"
    if t.startswith("mig-"):
        hits: list[tuple[PhysicalGpu, MigInstance | None]] = [
            (g, m) for g in gpus for m in g.mig if _norm(m.uuid).startswith(t)]
    else:
        if not t.startswith("gpu-"):
            t = "gpu-" + t  # ROCR accepts the bare hex too
        hits = [(g, None) for g in gpus if _norm(g.uuid).startswith(t)]
    return hits[0] if len(hits) == 1 else f"{'ambiguous' if hits else 'unknown'} device id {token!r}"


def _select(value: str, gpus: Sequence[PhysicalGpu], var: str, notes: list[str]) -> list[tuple[PhysicalGpu, MigInstance | None]]:
    """Apply one *_VISIBLE_DEVICES value to ``gpus`` (already in the order it indexes)."""
    chosen: list[tuple[PhysicalGpu, MigInstance | None]] = []
    seen: set[tuple[int, str]] = set()
    if not value.strip():
        return chosen
    for raw in value.split(","):
        token = raw.strip()
        if token.lstrip("-").isdigit():
            i = int(token)
            if i < 0 or i >= len(gpus):
                notes.append(f"{var}: entry {token!r} is not a device; CUDA/HIP ignore it and the rest")
                break
            hit: tuple[PhysicalGpu, MigInstance | None] | str = (gpus[i], None)
        else:
            hit = _match_uuid(token, gpus)
        if isinstance(hit, str):
            notes.append(f"{var}: {hit}; CUDA/HIP ignore it and the rest")
            break
        key = (hit[0].index, hit[1].uuid if hit[1] else "")
        if key in seen:
            notes.append(f"{var}: {token!r} repeated; CUDA/HIP ignore it and the rest")
            break
        seen.add(key)
        chosen.append(hit)
    return chosen


def _visible(chosen: list[tuple[PhysicalGpu, MigInstance | None]]) -> list[VisibleGpu]:
    return [VisibleGpu(i, g.index, m.uuid if m else g.uuid, m) for i, (g, m) in enumerate(chosen)]


def nvidia_visible(gpus: Sequence[PhysicalGpu], env: Mapping[str, str]) -> Visibility:
    """The NVIDIA GPUs (or MIG instances) a CUDA program started with ``env`` sees."""
    notes: list[str] = []
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        chosen: list[tuple[PhysicalGpu, MigInstance | None]] = [(g, None) for g in gpus]
        source = "all"
    else:
        chosen = _select(value, gpus, "CUDA_VISIBLE_DEVICES", notes)
        source = f"CUDA_VISIBLE_DEVICES={value}"
    names = {g.name for g, _ in chosen}
    if len(names) > 1 and env.get("CUDA_DEVICE_ORDER", "").upper() != "PCI_BUS_ID":
        notes.append("GPUs of different kinds and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA may number them "
                     "differently from NVML (visible_index follows PCI bus order)")
    return Visibility(_visible(chosen), source, notes)


def amd_visible(gpus: Sequence[PhysicalGpu], env: Mapping[str, str]) -> Visibility:
    """The AMD GPUs a HIP program started with ``env`` sees (ROCR first, then HIP/CUDA)."""
    notes: list[str] = []
    sources: list[str] = []
    chosen: list[tuple[PhysicalGpu, MigInstance | None]] = [(g, None) for g in gpus]
    rocr = env.get("ROCR_VISIBLE_DEVICES")
    if rocr is not None:
        chosen = _select(rocr, gpus, "ROCR_VISIBLE_DEVICES", notes)
        sources.append(f"ROCR_VISIBLE_DEVICES={rocr}")
    for var in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        hip = env.get(var)
        if hip is None:
            continue
        # HIP indexes into what ROCR left: re-number that list before selecting.
        remaining = [PhysicalGpu(index=i, uuid=g.uuid, name=g.name) for i, (g, _) in enumerate(chosen)]
        picked = _select(hip, remaining, var, notes)
        chosen = [chosen[p.index] for p, _ in picked]
        sources.append(f"{var}={hip}")
        break  # HIP_VISIBLE_DEVICES wins over CUDA_VISIBLE_DEVICES
    return Visibility(_visible(chosen), ", ".join(sources) or "all", notes)

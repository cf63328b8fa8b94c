"""Every cupti-python release ``maxinstr[cupti]`` allows, checked without a GPU and without
installing them (CI installs one): each release's description, recorded from its real wheel
(tests/data/cupti/cupti_python/, PROVENANCE.md there), against the extra's pin; the installed
release against its own description, made the same way; and the collector's own check and choice
of record layouts (maxinstr.kernels.convert.check_cupti_python) on each. The collector running end
to end as each release is in test_collector_fake.py (test_every_allowed_cupti_python_release...)."""

from __future__ import annotations

import enum
import importlib.metadata as md
import importlib.util
import json
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from maxinstr.kernels.base import KernelsUnavailable
from maxinstr.kernels.convert import RECORD_FIELDS, check_cupti_python

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data" / "cupti" / "cupti_python"
DESCRIPTIONS = {p.stem: json.loads(p.read_text()) for p in sorted(DATA.glob("[0-9]*.json"))}
RELEASES = sorted(DESCRIPTIONS, key=Version)
H200_RELEASE = "13.0.1"  # the release whose records matched nsys on the H200 (docs/kernels.md, Proof)


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _extra_pin() -> SpecifierSet:
    """The cupti-python requirement of the installed maxinstr's ``cupti`` extra."""
    for req in md.requires("maxinstr") or []:
        spec, _, marker = req.partition(";")
        if spec.strip().startswith("cupti-python") and '"cupti"' in marker:
            return SpecifierSet(spec.strip()[len("cupti-python"):])
    raise AssertionError(f"maxinstr has no cupti extra requiring cupti-python: {md.requires('maxinstr')}")


def _dtype(layout: dict) -> np.dtype:
    fields = layout["fields"]
    return np.dtype({"names": list(fields), "formats": [f[0] for f in fields.values()],
                     "offsets": [f[1] for f in fields.values()], "itemsize": layout["itemsize"]})  # fmt: skip


def _as_module(desc: dict) -> types.ModuleType:
    """A module with what ``desc`` says the release has: its struct dtypes, record classes, the
    functions present, its enums (the cbid enums with as many launch functions as it has)."""
    m = types.ModuleType("cupti.cupti")
    for name, layout in desc["layouts"].items():
        setattr(m, name, _dtype(layout))
    for name in desc["classes"]:
        setattr(m, name, type(name, (), {"from_ptr": staticmethod(lambda ptr, readonly=False: None)}))
    for name, present in desc["functions"].items():
        if present:
            setattr(m, name, lambda *args: None)
    for name, members in desc["enums"].items():
        setattr(m, name, enum.IntEnum(name, members))
    for domain, n in desc["launch_functions"].items():
        if n is not None:
            setattr(m, f"{domain}_api_trace_cbid", enum.IntEnum(f"{domain}_api_trace_cbid", {f"Launch{i}": i for i in range(n)}))
    return m


def test_the_descriptions_are_exactly_the_releases_the_extra_allows():
    """Every release on the index the pin allows has a description, and the pin allows no release
    past the newest described (a later one is allowed by recording it first)."""
    pin = _extra_pin()
    index = json.loads((DATA / "index.json").read_text())
    assert {v for v in index["available"] if v in pin} == set(RELEASES), (str(pin), RELEASES)
    assert all(v in pin for v in RELEASES)
    newest = Version(RELEASES[-1])
    for later in (f"{newest.major}.{newest.minor}.{newest.micro + 1}", f"{newest.major}.{newest.minor + 1}.0",
                  f"{newest.major + 1}.0.0", f"{newest}.post1"):  # fmt: skip
        assert later not in pin, f"{pin} allows {later}, which no description covers"
    assert all(d["cupti_python"] == v for v, d in DESCRIPTIONS.items())


def test_the_installed_release_is_its_recorded_description():
    """CI's cupti-python (``.[test]``), described now by the same code that recorded the others:
    the recording is faithful, and an installed release the pin allows is one that was checked."""
    cupti = pytest.importorskip("cupti.cupti")
    describer = _load("cupti_python_description", HERE / "cupti_python_description.py")
    installed = md.version("cupti-python")
    if installed not in _extra_pin():
        pytest.skip(f"cupti-python {installed} is outside maxinstr[cupti]'s pin")
    assert installed in DESCRIPTIONS, f"cupti-python {installed} is allowed but was never described"
    assert describer.describe(cupti) == DESCRIPTIONS[installed]


def test_every_field_read_has_one_offset_in_every_struct_of_every_release():
    """Why the newest struct a release describes reads what any libcupti of CUDA 13 writes: every
    field the collector reads has the same type and offset in every struct version of its kind
    (ActivityKernel9 to 13, Memcpy5 to 7, Memset4 and 5), in every release; newer structs only
    add fields after them."""
    seen: dict[tuple[str, str], set[tuple[str, int]]] = {}
    for desc in DESCRIPTIONS.values():
        for name, layout in desc["layouts"].items():
            family = name.removeprefix("activity_").removesuffix("_dtype").rstrip("0123456789")
            for field in RECORD_FIELDS[family]:
                seen.setdefault((family, field), set()).add(tuple(layout["fields"][field]))
    assert {k for k in seen} == {(f, x) for f, fields in RECORD_FIELDS.items() for x in fields}
    assert {k: v for k, v in seen.items() if len(v) != 1} == {}


@pytest.mark.parametrize("release", RELEASES)
def test_the_collector_reads_each_release_with_its_newest_struct(release):
    desc = DESCRIPTIONS[release]
    layouts = check_cupti_python(_as_module(desc))
    newest_kernel = max((c for c in desc["classes"] if c[len("ActivityKernel"):].isdigit() and c.startswith("ActivityKernel")),
                        key=lambda c: int(c[len("ActivityKernel"):]))  # fmt: skip
    assert layouts["kernel"].name == newest_kernel
    assert layouts["api"].name == "ActivityAPI" and layouts["external_correlation"].name == "ActivityExternalCorrelation"
    h200 = check_cupti_python(_as_module(DESCRIPTIONS[H200_RELEASE]))
    for family, fields in RECORD_FIELDS.items():
        got, ref = layouts[family], h200[family]
        assert {f: got.dtype.fields[f][:2] for f in fields} == {f: ref.dtype.fields[f][:2] for f in fields}
        assert got.read_bytes == ref.read_bytes <= ref.dtype.itemsize
    assert h200["kernel"].read_bytes == 152  # graph_node_id, the last field read, ends there


def _refused(desc: dict) -> str:
    with pytest.raises(KernelsUnavailable) as exc:
        check_cupti_python(_as_module(desc))
    text = str(exc.value)
    assert text.startswith("cupti-python ") and " is not supported: " in text and "pip install 'maxinstr[cupti]'" in text
    assert "\n" not in text
    return text


def test_a_release_the_collector_cannot_read_is_refused_saying_what_it_lacks():
    """Copies of 13.4.0's description, each changed in one stated way."""
    base = json.dumps(DESCRIPTIONS["13.4.0"])

    no_kernels = json.loads(base)  # no kernel struct at all
    no_kernels["layouts"] = {k: v for k, v in no_kernels["layouts"].items() if not k.startswith("activity_kernel")}
    assert "no kernel record layout it can read (no activity_kernel*_dtype)" in _refused(no_kernels)

    renamed = json.loads(base)  # correlation_id renamed in every kernel struct
    for k, v in renamed["layouts"].items():
        if k.startswith("activity_kernel"):
            v["fields"]["correlation_id_v2"] = v["fields"].pop("correlation_id")
    text = _refused(renamed)
    assert "activity_kernel13_dtype: no correlation_id" in text and "activity_kernel9_dtype: no correlation_id" in text

    no_pop = json.loads(base)  # a function the stage correlation needs
    no_pop["functions"]["activity_pop_external_correlation_id"] = False
    assert "no activity_pop_external_correlation_id" in _refused(no_pop)

    no_cbids = json.loads(base)  # the launch functions' ids (what the launch tags are set on)
    no_cbids["launch_functions"]["driver"] = None
    assert "no driver_api_trace_cbid" in _refused(no_cbids)


def test_the_newest_struct_that_has_every_field_is_chosen():
    """13.4.0's description with ActivityKernel13's start field made a float: Kernel12 is read."""
    desc = json.loads(json.dumps(DESCRIPTIONS["13.4.0"]))
    desc["layouts"]["activity_kernel13_dtype"]["fields"]["start"][0] = "<f8"
    assert check_cupti_python(_as_module(desc))["kernel"].name == "ActivityKernel12"
    del desc["classes"][desc["classes"].index("ActivityKernel12")]  # a struct without its record class
    assert check_cupti_python(_as_module(desc))["kernel"].name == "ActivityKernel11"


def test_the_stand_in_cupti_plays_the_recorded_enums_and_functions():
    """The stand-in of test_collector_fake.py keeps fixed enum values and every function: they are
    those of every release described."""
    fake = _load("fake_cupti_standin", HERE / "fake_cupti" / "cupti" / "cupti.py")
    for release, desc in DESCRIPTIONS.items():
        for name, members in desc["enums"].items():
            assert {m: int(getattr(getattr(fake, name), m)) for m in members} == members, (release, name)
        assert all(desc["functions"].values()), release
        assert all(callable(getattr(fake, f, None)) for f in desc["functions"]), release

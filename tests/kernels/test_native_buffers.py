"""The stage core's CUPTI activity buffers (``_native.cupti_buffers/cupti_flush/cupti_take``)
against the stand-in libcupti (tests/core/native/fake_cupti.c): records come back whole and in
order with their offsets, several buffers when one is too small, and a queue over its bound
drops whole buffers and counts their records; the flush runs with the GIL released."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("maxinstr._native", reason="maxinstr._native is not built")

NATIVE_SRC = Path(__file__).resolve().parents[1] / "core" / "native" / "fake_cupti.c"

SCRIPT = textwrap.dedent(
    """
    import ctypes, json, sys
    import numpy as np
    from maxinstr import _native
    path, buf_bytes, pending = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    lib.fake_cupti_queue.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.fake_cupti_set_size.argtypes = [ctypes.c_int, ctypes.c_size_t]
    lib.fake_cupti_set_size(5, 40)   # "runtime API" records: 40 bytes
    lib.fake_cupti_set_size(10, 216) # "kernel" records: 216 bytes
    assert _native.cupti_buffers(path, buf_bytes, pending)
    sizes = []
    for i in range(100):
        size = 216 if i % 3 == 2 else 40
        rec = np.zeros(size, np.uint8)
        rec[:4].view("<i4")[0] = 10 if size == 216 else 5
        rec[8:16].view("<u8")[0] = i            # a payload to find again
        lib.fake_cupti_queue(rec.ctypes.data, size)
        sizes.append(size)
    rc = _native.cupti_flush(0)
    got = _native.cupti_take()
    seen = []
    for data, offs in got:
        o = np.frombuffer(offs, np.int64)
        assert len(data) % 8 == 0 and (o % 8 == 0).all()
        for x in o.tolist():
            seen.append((int(np.frombuffer(data, "<i4", 1, x)[0]), int(np.frombuffer(data, "<u8", 1, x + 8)[0])))
    print("@@" + json.dumps(dict(rc=rc, gil_in_flush=lib.fake_cupti_gil_in_flush(), buffers=len(got), seen=seen, sizes=sizes, stats=_native.cupti_buffer_stats(),
                                 again=len(_native.cupti_take()))))
    """
)


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("fakecupti") / "libcupti.so.13-fake"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(NATIVE_SRC), "-lpthread"], check=True, capture_output=True)
    return out


def _run(lib: Path, buf_bytes: int, pending: int) -> dict:
    import maxinstr

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(maxinstr.__file__).resolve().parent.parent), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(lib), str(buf_bytes), str(pending)], env=env, capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("@@")][-1][2:])


def test_records_come_back_whole_in_order_across_buffers(fake_lib):
    out = _run(fake_lib, 4096, 1 << 20)  # 100 records (~9 KB) need three 4 KiB buffers
    assert out["rc"] == 0 and out["buffers"] == 3 and out["again"] == 0
    assert out["gil_in_flush"] == 0  # CUPTI flushes (and calls back) with the GIL released
    assert out["seen"] == [[10 if s == 216 else 5, i] for i, s in enumerate(out["sizes"])]
    st = out["stats"]
    assert st["registered"] and st["completed"] == 3 and st["dropped_buffers"] == 0 and st["walk_errors"] == 0


def test_a_queue_over_its_bound_drops_whole_buffers_and_counts_their_records(fake_lib):
    out = _run(fake_lib, 4096, 5000)  # room for one full buffer waiting, not two
    st = out["stats"]
    assert out["buffers"] == 1 and st["dropped_buffers"] == 2
    assert len(out["seen"]) + st["dropped_records"] == 100  # every record either delivered or counted
    assert [s[1] for s in out["seen"]] == list(range(len(out["seen"])))

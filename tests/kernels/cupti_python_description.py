"""What maxinstr's CUPTI collector relies on in one cupti-python release, as JSON: its record
layouts (every ``activity_<kind>N_dtype`` of the record kinds the collector reads, field by
field), record classes, the functions and enum values the collector calls, and whether freeing a
record object made over a foreign buffer prints on stderr (cupti-python 13.0.x does).

The descriptions in tests/data/cupti/cupti_python/ were made with this file, one release at a
time, in a scratch virtual environment holding that release (tests/data/cupti/cupti_python/
PROVENANCE.md):

    python tests/kernels/cupti_python_description.py > tests/data/cupti/cupti_python/VERSION.json

tests/kernels/test_cupti_python_versions.py checks the installed release against its recorded
description with the same :func:`describe`, and the collector against every recorded one.
No GPU is needed: nothing here calls into libcupti.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from typing import Any

# the record kinds the collector reads (maxinstr.kernels.cupti.RECORD_FIELDS) and their class stems
FAMILIES = {"kernel": "Kernel", "memcpy": "Memcpy", "memset": "Memset", "api": "API",
            "external_correlation": "ExternalCorrelation"}  # fmt: skip
# every cupti-python function maxinstr.kernels.cupti calls, required or optional
FUNCTIONS = ("subscribe", "unsubscribe", "activity_register_callbacks", "activity_enable", "activity_disable",
             "activity_enable_driver_api", "activity_enable_runtime_api", "get_timestamp", "get_callback_name",
             "activity_pop_external_correlation_id", "activity_get_num_dropped_records", "activity_flush_all")  # fmt: skip
ENUM_MEMBERS = {
    "ActivityKind": ("MEMCPY", "MEMSET", "KERNEL", "DRIVER", "RUNTIME", "CONCURRENT_KERNEL", "EXTERNAL_CORRELATION"),
    "ExternalCorrelationKind": ("CUSTOM2",),
    "CallbackDomain": ("DRIVER_API", "RUNTIME_API"),
    "Result": ("ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED",),
}
LAUNCH_WORDS = ("Launch", "Memcpy", "Memset")  # maxinstr.kernels.cupti._LAUNCH_WORDS


def _dtype(dt: Any) -> dict[str, Any]:
    return {"itemsize": int(dt.itemsize),
            "fields": {name: [dt.fields[name][0].str, int(dt.fields[name][1])] for name in dt.names}}  # fmt: skip


def _free_prints(c: Any, class_name: str) -> bool:
    """Whether freeing a record object made with ``from_ptr`` over a buffer cupti-python did not
    allocate prints anything (cupti-python <= 13.0.1: a KeyError traceback, twice)."""
    import gc

    import numpy as np

    buf = np.zeros(4096, np.uint8)
    err = io.StringIO()
    hooks = sys.excepthook, sys.unraisablehook
    # Python's own hooks, which print (pytest puts its own unraisable hook in place during a test)
    sys.excepthook, sys.unraisablehook = sys.__excepthook__, sys.__unraisablehook__
    try:
        with contextlib.redirect_stderr(err):
            obj = getattr(c, class_name).from_ptr(buf.ctypes.data, True)
            del obj
            gc.collect()
    finally:
        sys.excepthook, sys.unraisablehook = hooks
    return bool(err.getvalue())


def describe(c: Any) -> dict[str, Any]:
    """The description of the cupti-python module ``c`` (``from cupti import cupti``)."""
    from importlib.metadata import version

    layouts, classes = {}, []
    for family, stem in FAMILIES.items():
        for name in sorted(dir(c)):
            m = re.fullmatch(rf"activity_{family}(\d*)_dtype", name)
            if m:
                layouts[name] = _dtype(getattr(c, name))
            m = re.fullmatch(rf"Activity{stem}(\d*)", name)
            if m:
                classes.append(name)
    enums: dict[str, dict[str, int]] = {}
    for enum_name, members in ENUM_MEMBERS.items():
        enum = getattr(c, enum_name, None)
        enums[enum_name] = {m: int(getattr(enum, m)) for m in members if hasattr(enum, m)}
    launch_functions = {}
    for domain in ("runtime", "driver"):
        ids = getattr(c, f"{domain}_api_trace_cbid", None)
        launch_functions[domain] = (None if ids is None else
                                    sum(1 for m in ids if any(w in str(m.name) for w in LAUNCH_WORDS)))  # fmt: skip
    kernel_classes = [n for n in classes if re.fullmatch(r"ActivityKernel\d+", n)]
    newest_kernel = max(kernel_classes, key=lambda n: int(n[len("ActivityKernel"):]), default=None)
    return {
        "cupti_python": version("cupti-python"),
        "layouts": layouts,
        "classes": sorted(classes),
        "functions": {f: callable(getattr(c, f, None)) for f in FUNCTIONS},
        "enums": enums,
        "launch_functions": launch_functions,
        "record_free_prints": _free_prints(c, newest_kernel) if newest_kernel else None,
    }


if __name__ == "__main__":
    from cupti import cupti

    json.dump(describe(cupti), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")

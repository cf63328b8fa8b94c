"""The built extension links no vendor library and imports no vendor symbol: CUDA, HIP and roctx
come in through dlopen at run time, NVTX is compiled in from its headers."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

native = pytest.importorskip("maxinstr._native")

ALLOWED = re.compile(r"^(libstdc\+\+|libm|libgcc_s|libc|libpthread|libdl|librt|ld-linux[-\w]*)\.so")


@pytest.mark.skipif(not shutil.which("readelf"), reason="needs readelf (binutils)")
def test_needs_only_the_c_and_cxx_runtime():
    out = subprocess.run(["readelf", "-d", native.__file__], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    assert needed, out
    assert all(ALLOWED.match(lib) for lib in needed), needed


@pytest.mark.skipif(not shutil.which("nm"), reason="needs nm (binutils)")
def test_no_vendor_symbols_and_one_export():
    undefined = subprocess.run(["nm", "-D", "--undefined-only", native.__file__], capture_output=True, text=True,
                               check=True).stdout.split()
    vendor = [s for s in undefined if re.match(r"^(cu[A-Z]|hip[A-Z]|roctx|nvtx)", s)]
    assert vendor == []
    defined = subprocess.run(["nm", "-D", "--defined-only", native.__file__], capture_output=True, text=True,
                             check=True).stdout
    exported = [ln.split()[-1] for ln in defined.splitlines() if " T " in ln]
    assert exported == ["PyInit__native"]

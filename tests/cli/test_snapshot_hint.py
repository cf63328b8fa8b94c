"""`maxinstr snapshot` without the vendor library says which extra to install (issue 17, point 8)."""

from __future__ import annotations

import subprocess
import sys

# pynvml and amdsmi made unimportable in the child, as on a machine without the extras
CHILD = ("import sys; sys.modules['pynvml'] = None; sys.modules['amdsmi'] = None; "
         "from maxinstr.cli import main; sys.exit(main(['snapshot', '--duration', '1']))")


def test_snapshot_without_nvidia_ml_py_names_the_extra():
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "pip install 'maxinstr[nvidia]'" in p.stderr
    assert "pip install 'maxinstr[amd]'" in p.stderr

"""maxinstr's start-up hook. `maxinstr run` puts this folder first on PYTHONPATH so every
Python process of the run reads this file before user code.

It must leave the program as it would be without maxinstr until the program asks for it: no
import beyond importlib's frozen core, no thread, no GPU call, no signal handler, no
environment change (tests/launch/test_hook_unseen.py holds it to that). All it does is put one
finder on ``sys.meta_path`` that waits for the first import of a module that asks for
maxinstr: ``maxinstr`` itself (the program opens a session or marks a stage), the top-level
package of a ``--stage`` target, or ``max`` when MAX's markers are on (they must be checked
before MAX loads). Only then does it import maxinstr and run
``maxinstr.launch.bootstrap.startup()``: the --stage wraps, the capture window, the run's
session. It never breaks the program, and it runs the sitecustomize it shadows (if any)
afterwards.
"""


class _MaxinstrTrigger:
    """A meta-path finder that starts maxinstr at the first import of a watched top-level name.
    It finds nothing itself: it answers that import as the finders after it would, with the
    module's loader wrapped so that maxinstr starts once the module has run. ``max`` is the
    exception (``before``): maxinstr starts before MAX runs, because MAX reads its markers'
    setting when it is imported. Starting never imports a module of ``after`` first: that
    module would run twice (the import in progress would run it again)."""

    def __init__(self, after, before, wanted):
        self.after = frozenset(after)
        self.before = frozenset(before)
        self.wanted = wanted
        self.fired = False

    def find_spec(self, fullname, path=None, target=None):
        if self.fired or (fullname not in self.after and fullname not in self.before):
            return None
        import sys

        self.fired = True
        before = fullname in self.before
        if before:
            _start_maxinstr(self.wanted)
        for finder in list(sys.meta_path):  # maxinstr's own finders (the --stage wraps) come first now
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            if not before:
                _start_maxinstr(self.wanted)  # nothing to run first: the import fails as it would
            return None
        if not before:
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _StartAfter(spec.loader, self.wanted)  # type: ignore[assignment]
            else:
                _start_maxinstr(self.wanted)
        return spec


class _StartAfter:
    """Runs the module with its own loader, then starts maxinstr (whatever the module did)."""

    def __init__(self, inner, wanted):
        self._inner = inner
        self._wanted = wanted

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        try:
            self._inner.exec_module(module)
        finally:
            # the module keeps its own loader, as without maxinstr
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._inner
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._inner
            _start_maxinstr(self._wanted)

    def __getattr__(self, item):  # get_source, is_package, get_filename ...
        return getattr(self._inner, item)


def _start_maxinstr(wanted):
    import sys

    try:
        from maxinstr.launch.bootstrap import startup
    except Exception as exc:  # noqa: BLE001 - maxinstr is not importable in this interpreter
        found = _from_own_site() if wanted else None
        if found is None:
            if wanted:
                sys.stderr.write(f"maxinstr: not importable in {sys.executable} ({exc}); this process is not instrumented\n")
            return
        startup = found
    startup()


def _from_own_site():
    """bootstrap.startup from the site folder this file was installed in, when this interpreter
    can load maxinstr's native module (the same Python version), else None. For a process whose
    interpreter lost its venv: Mojo's runtime (MAX) sets PYTHONEXECUTABLE to the `python3` on PATH,
    so MAX's `spawn` workers start with sys.executable and sys.prefix of that Python, without the
    venv's site-packages (multiprocessing restores the parent's sys.path only after start-up).
    The folder goes last on sys.path: this interpreter's own packages keep precedence."""
    import glob
    import importlib.machinery
    import os
    import sys

    site = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    native = os.path.join(site, "maxinstr", "_native")
    if not any(glob.glob(native + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES):
        return None
    if site not in sys.path:
        sys.path.append(site)
    try:
        from maxinstr.launch.bootstrap import startup
    except Exception:  # noqa: BLE001 - still not importable: said by the caller
        return None
    return startup


def _watched_names(environ):
    """``(after, before)``: the top-level names whose first import starts maxinstr. The one read
    of MAXINSTR_* outside maxinstr.config, on purpose: reading them through maxinstr would import it."""
    run = bool(environ.get("MAXINSTR_RUN_DIR", "").strip())
    specs = [line.strip() for line in environ.get("MAXINSTR_STAGES", "").splitlines() if line.strip()]
    if not run and not specs:
        return set(), set()
    after = {"maxinstr"}
    for spec in specs:
        module = spec.partition("=")[0].partition(":")[0].strip()
        if module:
            after.add(module.split(".")[0])
    before = set()
    if environ.get("MODULAR_ENABLE_PROFILING", "off").strip().lower() not in ("", "off", "0", "false"):
        before.add("max")  # MAX's markers can abort MAX where NVTX's v2 entry points are missing
    return after - before, before


def _maxinstr_install():
    import os
    import sys

    after, before = _watched_names(os.environ)
    if after or before:
        sys.meta_path.insert(0, _MaxinstrTrigger(after, before, wanted=True))


def _chain_shadowed_sitecustomize():
    # Our folder shadows any other sitecustomize (a distro's, a venv's): run that one too.
    # importlib's frozen core (always loaded) rather than importlib.util, which a program that
    # never imports it would otherwise find in sys.modules.
    import _frozen_importlib
    import _frozen_importlib_external
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = _frozen_importlib_external.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = _frozen_importlib.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - same policy as site.py: report, continue
        sys.stderr.write(f"Error in sitecustomize {spec.origin}: {exc}\n")
        return
    sys.modules["sitecustomize"] = module


_maxinstr_install()
_chain_shadowed_sitecustomize()

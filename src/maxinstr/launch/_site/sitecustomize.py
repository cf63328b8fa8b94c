"""maxinstr's start-up hook (first on PYTHONPATH under `maxinstr run`): no import, thread, GPU call, signal handler
or environment change (tests/launch/test_hook_unseen.py) until a finder sees the first import of ``maxinstr``, a
``--stage`` target's package, or ``max`` (MAX's markers on), then runs ``maxinstr.launch.bootstrap.startup()``.
It never breaks the program, and runs the sitecustomize it shadows."""

# Only what every Python has loaded when site runs this file (glob, importlib.machinery: where used)
import _frozen_importlib
import _frozen_importlib_external
import _thread
import os
import sys

# Top-level names starting maxinstr imports besides the standard library's (tests/launch/test_hook_triggers.py
# checks them against what startup() imports)
_MAXINSTR_NEEDS = frozenset(("maxinstr", "numpy", "rich", "click", "pynvml", "amdsmi"))


class _MaxinstrTrigger:
    """Starts maxinstr at the first import of a watched top-level name, once the module has run (its loader
    wrapped), or before it for ``max`` (MAX reads its markers' setting when imported). Finding a module
    without running it (``importlib.util.find_spec``, runpy's ``-m``) does not use the trigger up."""
    def __init__(self, after, before):
        self.after, self.before = frozenset(after), frozenset(before)
        self.fired = False  # maxinstr started, or starts once the import in progress has finished
        self._finding = set()  # (thread, name) being looked up through the other finders: no re-entry

    def find_spec(self, fullname, path=None, target=None):
        if self.fired or (fullname not in self.after and fullname not in self.before):
            return None
        finding = (_thread.get_ident(), fullname)
        if finding in self._finding:
            return None
        before = fullname in self.before
        if before:
            self.fired = True
            _start_maxinstr()
        self._finding.add(finding)
        try:  # maxinstr's own finders (the --stage wraps) come first now
            spec = next((s for f in list(sys.meta_path) if f is not self and hasattr(f, "find_spec")
                         and (s := f.find_spec(fullname, path, target)) is not None), None)
        finally:
            self._finding.discard(finding)
        if before:
            return spec
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _StartAfter(spec.loader, self)  # type: ignore[assignment]
        else:  # nothing to run first (the import fails as it would), or nothing to wrap
            self.fired = True
            _start_when_safe()
        return spec


class _StartAfter:  # runs the module with its own loader, then starts maxinstr (whatever the module did)
    def __init__(self, inner, trigger):
        self._inner, self._trigger = inner, trigger

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        first = not self._trigger.fired  # else another import got there first (a second thread)
        self._trigger.fired = True
        try:
            self._inner.exec_module(module)
        finally:
            # the module keeps its own loader, as without maxinstr
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._inner
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._inner
            if first:
                _start_when_safe(spec)

    def __getattr__(self, item):  # get_source, is_package, get_filename ...
        return getattr(self._inner, item)


def _start_when_safe(own=None):
    """Start maxinstr once the import of ``own`` (the module that asked) has finished, never in the middle
    of an import on this thread that starting maxinstr would meet half-done (numpy imports math,
    maxinstr imports numpy): then once the outermost such import has. Without either, now."""
    wait = _outermost_loading(own)
    if wait is None or not _start_after_load(wait):
        _start_maxinstr()


def _outermost_loading(own):
    """Of the imports this thread runs (importlib's _load_unlocked frames), the outermost whose top-level
    package starting maxinstr imports, else ``own`` when it is one, else None."""
    needs = _MAXINSTR_NEEDS | getattr(sys, "stdlib_module_names", frozenset())
    found, own_loading = None, False
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_load_unlocked" and code.co_filename == "<frozen importlib._bootstrap>":
            spec = frame.f_locals.get("spec")
            if spec is not None and getattr(spec, "_initializing", False):
                own_loading = own_loading or spec is own
                if str(getattr(spec, "name", "")).partition(".")[0] in needs:
                    found = spec  # walking outwards: the last one found is the outermost
        frame = frame.f_back  # type: ignore[assignment]  # None ends the walk
    return found if found is not None else (own if own_loading else None)


_after_load: set = set()  # id(spec) of the imports whose end starts maxinstr
_watching_classes: dict = {}  # spec class -> its subclass that sees ``_initializing`` set


def _loading_get(spec):
    return spec.__dict__.get("_initializing", False)


def _loading_set(spec, value):
    spec.__dict__["_initializing"] = value
    if value:
        return
    # importlib's last act on a finished (or failed) import; the spec is as it was again
    spec.__class__ = type(spec).__mro__[1]
    if id(spec) not in _after_load:
        return
    _after_load.remove(id(spec))
    # bind a submodule on its package now, as importlib does next: starting maxinstr finds `email.message`
    parent, _, child = str(getattr(spec, "name", "")).rpartition(".")
    module = sys.modules.get(spec.name) if parent else None
    if module is not None and sys.modules.get(parent) is not None:
        try:
            setattr(sys.modules[parent], child, module)
        except Exception:  # noqa: BLE001 - importlib says nothing of this either
            pass
    _start_maxinstr()


def _start_after_load(spec):
    """Have importlib's ``spec._initializing = False`` (the import's end) start maxinstr; False: unwatchable."""
    base = type(spec)
    try:
        watching = _watching_classes.get(base)
        if watching is None:
            watching = type(base.__name__, (base,), {"__slots__": (), "__module__": base.__module__,
                                                     "_initializing": property(_loading_get, _loading_set)})
            _watching_classes[base] = watching
        _after_load.add(id(spec))
        spec.__class__ = watching
    except Exception:  # noqa: BLE001 - an odd spec class: start now, as before
        _after_load.discard(id(spec))
        return False
    return True


def _start_maxinstr():
    try:
        from maxinstr.launch.bootstrap import startup
    except Exception as exc:  # noqa: BLE001 - maxinstr is not importable in this interpreter
        found = _from_own_site()
        if found is None:
            sys.stderr.write(f"maxinstr: not importable in {sys.executable} ({exc}); this process is not instrumented\n")
            return
        startup = found
    startup()


def _from_own_site():
    """bootstrap.startup from the site folder this file is in, if this interpreter loads its native module:
    for a process that lost its venv (Mojo's runtime sets PYTHONEXECUTABLE to the `python3` on PATH, so
    MAX's `spawn` workers start without its site-packages). Last on sys.path."""
    import glob
    import importlib.machinery

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
    """``(after, before)``: the top-level names whose first import starts maxinstr (MAXINSTR_* read here,
    not through maxinstr.config: that would import maxinstr)."""
    run = bool(environ.get("MAXINSTR_RUN_DIR", "").strip())
    specs = [line.strip() for line in environ.get("MAXINSTR_STAGES", "").splitlines() if line.strip()]
    if not run and not specs:
        return set(), set()
    after = {"maxinstr"} | {s.partition("=")[0].partition(":")[0].strip().split(".")[0] for s in specs} - {""}
    # MAX's markers can abort MAX where NVTX's v2 entry points are missing: checked before MAX loads
    markers = environ.get("MODULAR_ENABLE_PROFILING", "off").strip().lower() not in ("", "off", "0", "false")
    before = {"max"} if markers else set()
    return after - before, before


def _maxinstr_install():
    after, before = _watched_names(os.environ)
    if not after and not before:
        return
    if any(name in sys.modules for name in after):
        # Python's own start-up imported it (os, io; a .pth file): maxinstr starts once `site` has
        _start_when_safe()
        return
    sys.meta_path.insert(0, _MaxinstrTrigger(after, before))


def _chain_shadowed_sitecustomize():
    # Ours shadows any other sitecustomize (a distro's, a venv's): run that one too, through importlib's
    # frozen core (always loaded), not importlib.util (the program would find it loaded)
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

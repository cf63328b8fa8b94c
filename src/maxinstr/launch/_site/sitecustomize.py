"""maxinstr's start-up hook. `maxinstr run` puts this folder first on PYTHONPATH so every
Python process of the run calls maxinstr.launch.bootstrap.startup() before user code.
It never breaks the program, and it runs the sitecustomize it shadows (if any) afterwards."""


def _maxinstr_startup() -> None:
    import os
    import sys

    # The one read of MAXINSTR_* outside maxinstr.config, on purpose: it decides whether to say
    # that maxinstr cannot be imported here, so it cannot use maxinstr's own module to read them.
    wanted = any(os.environ.get(k, "").strip() for k in ("MAXINSTR_RUN_DIR", "MAXINSTR_STAGES"))
    try:
        from maxinstr.launch.bootstrap import startup
    except Exception as exc:  # noqa: BLE001 - maxinstr is not importable in this interpreter
        found = _from_own_site() if wanted else None
        if found is None:
            if wanted:
                sys.stderr.write(f"maxinstr: not importable in {sys.executable} ({exc}); this process is not instrumented\n")
            return
        found()
        return
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


def _chain_shadowed_sitecustomize() -> None:
    # Our folder shadows any other sitecustomize (a distro's, a venv's): run that one too.
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - same policy as site.py: report, continue
        sys.stderr.write(f"Error in sitecustomize {spec.origin}: {exc}\n")
        return
    sys.modules["sitecustomize"] = module


_maxinstr_startup()
_chain_shadowed_sitecustomize()

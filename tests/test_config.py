"""maxinstr.config: one truth rule for every yes/no variable, the same in C (csrc/core/base.h)
and in Python; every variable documented once (docs/sessions.md); no other code reads them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxinstr import _native, config

ROOT = Path(__file__).resolve().parents[1]
NAME = "MAXINSTR_TEST_TRUTH_RULE"
FUZZ = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck),
            derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1")

WORDS = list(config.TRUE_WORDS + config.FALSE_WORDS)


def _case_and_blanks(draw_word: str, cases: list[bool], left: str, right: str) -> str:
    return left + "".join(c.upper() if up else c for c, up in zip(draw_word, cases + [False] * 8)) + right


BLANKS = st.text(alphabet=" \t\n\r\v\f", max_size=3)
# env values cannot hold NUL; everything else goes (surrogates reach the C side as raw bytes)
ANY = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
VALUES = st.one_of(
    ANY,
    st.builds(_case_and_blanks, st.sampled_from(WORDS), st.lists(st.booleans(), max_size=5), BLANKS, BLANKS),
    st.sampled_from(["", " ", "\u00a0on", "on\u2003", "\u212a", "ｏｎ", "yes please", "2", "-1", "01", "tru", "offf",
                     "on\udcff", "\udcc3\udca9"]),
)


def expected(value: str, default: bool) -> tuple[bool, bool]:
    """The rule written out: (result, warned)."""
    word = value.strip(" \t\n\r\v\f")
    word = "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in word)
    if word == "":
        return default, False
    if word in config.TRUE_WORDS:
        return True, False
    if word in config.FALSE_WORDS:
        return False, False
    return default, True


@settings(max_examples=400, **FUZZ)
@given(value=VALUES, default=st.booleans())
def test_the_truth_rule(value, default):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = config.flag(NAME, default, {NAME: value})
    want, warned = expected(value, default)
    assert got is want
    ours = [w for w in caught if NAME in str(w.message)]
    assert len(ours) == (1 if warned else 0), [str(w.message) for w in caught]
    if warned:
        assert "\n" not in str(ours[0].message) and repr(value) in str(ours[0].message)


def test_unset_is_the_default():
    assert config.flag(NAME, True, {}) is True and config.flag(NAME, False, {}) is False


@settings(max_examples=300, **FUZZ)
@given(value=VALUES, default=st.booleans())
def test_c_and_python_read_a_flag_alike(value, default):
    os.environ[NAME] = value
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert _native._env_flag(NAME, default) is config.flag(NAME, default)
    finally:
        del os.environ[NAME]


def _read_at_import(value: str) -> tuple[bool, bool, str]:
    code = ("import warnings; warnings.simplefilter('ignore')\n"
            "from maxinstr import _native, config\n"
            "print(int(_native.is_enabled()), int(config.disabled()))")
    env = {k: v for k, v in os.environ.items() if k != config.DISABLE}
    env[config.DISABLE] = value
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    enabled, disabled = p.stdout.split()
    return enabled == "1", disabled == "1", p.stderr


@pytest.mark.parametrize("value, disabled", [
    ("1", True), ("on", True), ("TRUE", True), (" yes ", True),
    ("0", False), ("off", False), ("Off", False), ("no", False), ("false", False), ("", False), ("maybe", False),
])  # fmt: skip
def test_the_core_and_python_agree_on_maxinstr_disable(value, disabled):
    """MAXINSTR_DISABLE as the native core acts on it at import, and as maxinstr.config reads it.
    ``off`` used to disable (anything but 0/false/no did)."""
    enabled_native, disabled_python, stderr = _read_at_import(value)
    assert enabled_native is not disabled and disabled_python is disabled
    said = [ln for ln in stderr.splitlines() if "MAXINSTR_DISABLE='maybe' is not one of" in ln]
    assert len(said) == (1 if value == "maybe" else 0), stderr


@pytest.mark.parametrize("raw, value", [("", None), ("7", 7), (" 3 ", 3), ("-1", None), ("x", None), ("2.5", None)])
def test_a_count_that_is_not_one_is_said_and_left_out(raw, value):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert config.warmup_instances({config.WARMUP: raw}) == value
    assert len(caught) == (1 if raw.strip() and value is None else 0)


def test_numbers_fall_back_to_their_default_with_one_warning():
    with pytest.warns(RuntimeWarning, match="MAXINSTR_WRITER_INTERVAL_MS='0'"):
        assert config.writer_interval_ms({config.WRITER_INTERVAL_MS: "0"}) == config.DEFAULT_WRITER_INTERVAL_MS
    assert config.writer_interval_ms({config.WRITER_INTERVAL_MS: "0.5"}) == 0.5
    with pytest.warns(RuntimeWarning, match="MAXINSTR_MEMORY_RECORDS='lots'"):
        assert config.memory_records({config.MEMORY_RECORDS: "lots"}) == 1 << 20
    assert config.capture_window_s({config.CAPTURE_WINDOW_S: "7.5"}) == 7.5
    assert config.capture_window_s({}) is None


@pytest.mark.parametrize("raw, request_", [("1", "1"), ("nsys", "nsys"), ("0", None), ("off", None), ("", None)])
def test_capture_is_asked_by_any_value_but_a_false_word(raw, request_):
    assert config.capture_request({config.CAPTURE: raw}) == request_


# -- one place: every variable read is registered and documented, and read only here ------------


def _names_in(paths) -> set[str]:
    found: set[str] = set()
    for path in paths:
        found.update(re.findall(r"(?<![A-Za-z0-9_])MAXINSTR_[A-Z0-9_]+", path.read_text(errors="replace")))
    return found


NOT_VARIABLES = {
    "MAXINSTR_HIDDEN",  # base.h's visibility macro
    "MAXINSTR_BENCH_PROBES",  # a CMake option (-D), not the environment
    "MAXINSTR_CORE_SOURCES",  # a CMake list
    "MAXINSTR_DOMAIN",  # the NVTX domain's name, a constant
}


def test_every_variable_in_the_code_is_registered_and_documented():
    sources = [*ROOT.joinpath("src").rglob("*.py"), *ROOT.joinpath("csrc").rglob("*.[ch]*"),
               *ROOT.joinpath("csrc").rglob("CMakeLists.txt")]
    tests = [p for p in ROOT.joinpath("tests").rglob("*") if p.suffix in (".py", ".c") and "data" not in p.parts]
    used = (_names_in(sources) | _names_in(tests)) - NOT_VARIABLES - {NAME, "MAXINSTR_SOMETHING"}
    assert used - set(config.VARIABLES) == set()
    table = ROOT.joinpath("docs", "sessions.md").read_text().split("## Environment variables", 1)[1]
    documented = set(re.findall(r"`(MAXINSTR_[A-Z0-9_]+)`", table))
    assert set(config.VARIABLES) - documented == set()


def test_no_other_code_reads_a_variable():
    """Python: only maxinstr/config.py (and the start-up hook, which runs before maxinstr can be
    imported); C: only base.h calls getenv."""
    read = re.compile(r"""(environ(\.get)?\s*[\[(]\s*["']MAXINSTR_|getenv\(\s*["']MAXINSTR_)""")
    allowed = {ROOT / "src/maxinstr/config.py", ROOT / "src/maxinstr/launch/_site/sitecustomize.py"}
    offenders = [str(p.relative_to(ROOT)) for p in ROOT.joinpath("src").rglob("*.py")
                 if p not in allowed and read.search(p.read_text())]
    assert offenders == []
    c_reads = [str(p.relative_to(ROOT)) for p in ROOT.joinpath("csrc").rglob("*.[ch]*")
               if "getenv(" in p.read_text() and p.name != "base.h"]
    assert c_reads == []


def test_a_lone_surrogate_given_by_code_is_not_a_word():
    """config._word's fallback: no environment holds a lone surrogate (os.environ cannot), but a
    mapping given by code may; it reads as no yes/no word (one warning), never raises."""
    with pytest.warns(RuntimeWarning, match=NAME):
        assert config.flag(NAME, True, {NAME: "\ud800on"}) is True


@pytest.mark.parametrize("raw, value", [(None, None), ("", None), (" ", None), ("0", 0), ("2", 2), (" 1 ", 1),
                                        ("+3", 3), ("x", None), ("-1", None), ("2.5", None), ("1 2", None)])
def test_the_launcher_variables_have_one_rule(raw, value):
    """RANK, LOCAL_RANK and WORLD_SIZE: a whole number >= 0, blanks around it ignored; anything else
    names no rank, without a warning (it is the launcher's variable, not ours to judge)."""
    env = {} if raw is None else {"RANK": raw, "LOCAL_RANK": raw, "WORLD_SIZE": raw}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert config.rank(env) == config.local_rank(env) == config.world_size(env) == value

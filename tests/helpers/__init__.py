"""Helpers shared by more than one test folder (importable as ``helpers``: pyproject.toml's
``[tool.pytest.ini_options] pythonpath`` puts tests/ on the path).

- ``fixture_columns``: columns read straight from the real fixtures in tests/data (analyze, render, cli);
- ``fake_native``: the pure-Python stand-in for ``maxinstr._native`` (session, reliability);
- ``pin_times``: host durations pinned in a real run directory, so a loaded machine's sleeps
  do not decide a verdict (analyze);
- ``schema_check``: a report checked against the schema's TypedDicts at run time (analyze, reliability);
- ``session_fixtures``: the ``native`` / ``stage`` / ``mark`` fixtures over the real core or that
  stand-in, a pytest plugin that tests/conftest.py loads for every folder.

A helper used by one folder only stays in that folder, beside its tests.
"""

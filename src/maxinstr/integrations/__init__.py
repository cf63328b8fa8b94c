"""Helpers for MAX, PyTorch, CuPy (none a dependency: imported where needed; `None` without it or a GPU)."""

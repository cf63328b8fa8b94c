"""Small helpers for the frameworks maxinstr users run (MAX, PyTorch, CuPy; none a dependency):
each imports its framework inside the function that needs it and answers `None` where the
framework or a GPU is missing, so the same script runs on a laptop and on an H200."""

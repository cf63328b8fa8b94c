"""Test-only stand-in for NVIDIA's cupti-python (tests/kernels/test_collector_fake.py)."""

"""Helpers for tests and benchmarks (not used by the library itself)."""

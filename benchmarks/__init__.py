"""flightsrv benchmarks: ``python -m benchmarks [--scale small|full] [--only NAME]``.

Every benchmark module ``benchmarks/bench_*.py`` exposes ``NAME`` and ``run(ctx) -> list[Row]``.
Each row reports a figure *and* a ratio against a baseline measured in the same run, plus the
workload size. The runner prints one table and writes it to ``benchmarks/RESULTS.md``.
"""

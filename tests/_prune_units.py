"""Generated units for the pruner's property tests: each unit's (min, max) bounds, some
unknown (None), both drawn from integers ``lo..hi`` mapped by ``value`` and ordered by it."""

from __future__ import annotations


def unit_bounds(draw, st, lo: int, hi: int, value=lambda k: k) -> tuple[list, list]:
    """(mins, maxs) of 1-8 units; ``draw``/``st``: hypothesis's draw and strategies."""
    n = draw(st.integers(1, 8))
    mins, maxs = [], []
    for _ in range(n):
        if draw(st.booleans()) and draw(st.booleans()):
            mins.append(None)
            maxs.append(None)
            continue
        a, b = sorted(draw(st.lists(st.integers(lo, hi), min_size=2, max_size=2)), key=value)
        mins.append(value(a))
        maxs.append(value(b))
    return mins, maxs

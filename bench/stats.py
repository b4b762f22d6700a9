"""Percentiles and rates for the benchmark tables."""

from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-100) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def summary_ms(values_s: list[float]) -> dict:
    """p50/p95/p99 in milliseconds (rounded to 0.1 ms) of durations given in seconds."""
    return {f"p{q}_ms": round(percentile(values_s, q) * 1000.0, 1) for q in (50, 95, 99)} | {
        "samples": len(values_s)
    }


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """``ours / theirs`` to three significant digits, or None when either side is missing or
    zero."""
    if not ours or not theirs or math.isnan(ours) or math.isnan(theirs):
        return None
    return float(f"{ours / theirs:.3g}")

"""How far timed rows repeat: the same configuration on the same prompts, timed in two runs of one machine.

Two measurements each off by s (relative, normal) differ by about s x sqrt(2), so the share of repeats within
`tol` of each other gives s; and s gives the share of rows in which a prediction with no error of its own would
land within `tol` of one timed row: the most any cost model can score against that machine's timed rows."""
from __future__ import annotations

import math
from statistics import NormalDist

TOL = 0.10


def repeatability(ratios: list[float], tol: float = TOL) -> dict:
    """{"rows", "within" (ratios within tol of 1), "row_error" (s), "ceiling" (a perfect prediction's share
    within tol)}; s and the ceiling are None where every row or none is within tol (nothing to solve for)."""
    n = len(ratios)
    within = sum(abs(r - 1) <= tol for r in ratios)
    out = {"rows": n, "within": within, "row_error": None, "ceiling": None}
    if 0 < within < n:
        s = tol / (NormalDist().inv_cdf((1 + within / n) / 2) * math.sqrt(2))
        out |= {"row_error": s, "ceiling": 2 * NormalDist().cdf(tol / s) - 1}
    return out

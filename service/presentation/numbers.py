"""How a number is printed for people, the same on the pages, in the report and on the terminal."""

from __future__ import annotations

import math


def fmt(value: float | None, unit: str = "") -> str:
    """A number for people: 4 significant digits, scientific when tiny or huge, unit appended."""
    if value is None:
        return "–"
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, float) and math.isinf(value):
        return "∞" if value > 0 else "−∞"
    a = abs(value)
    if a != 0 and (a < 1e-2 or a >= 1e6):
        text = f"{value:.3e}"
    elif a >= 100:
        text = f"{value:.1f}"
    else:
        text = f"{value:.4g}"
    return f"{text} {unit}".rstrip() if unit else text

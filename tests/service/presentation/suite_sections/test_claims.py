"""An error's growth with T, on a gdn-op job stored through the store: rows are paired only with
rows alike but for their length (same backend, mode, heads), and growth is claimed only where
the bootstrap interval of the ratio of medians excludes 1; otherwise "no change the data can
support"."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.stored_report import Cases, document, report


def gdn_case(backend: str, T: int, dq: float, spread: float) -> tuple[str, tuple[dict[str, Any], Any]]:
    """One accuracy case, its dq relative-L2 over 9 seeds spread ±`spread` around `dq`."""
    p = {"backend": backend, "seq_len": T, "mode": "stateful", "qk_heads": 16, "v_heads": 32, "batch": 1}
    values = [dq + spread * x for x in np.linspace(-1.0, 1.0, 9)]
    return f"T{T}_stateful_hqk16_{backend}", (p, {"dq_rel_l2": values})


def conclusions(tmp: Path, cases: Cases) -> str:
    return report(tmp, [document("gdn-op", 1, "c" * 40, cases)])["Conclusions"]


def test_backends_are_not_compared_with_each_other(tmp_path: Path) -> None:
    # eager flat at 1e-7; triton ran at 8K only, a thousand times higher: no pair crosses backends
    cases = dict([
        gdn_case("eager", 4096, 1e-7, 1e-9),
        gdn_case("eager", 8192, 1e-7, 1e-9),
        gdn_case("triton", 8192, 1e-4, 1e-6),
    ])
    text = conclusions(tmp_path, cases)
    assert "no change the data can support with T in any of 1 comparison(s)" in text, text
    assert "grows" not in text


def test_growth_is_claimed_only_where_the_ratio_s_interval_excludes_one(tmp_path: Path) -> None:
    cases = dict([
        gdn_case("triton", 4096, 1e-4, 1e-6),  # to 3e-4 at 8K, tight: it grows
        gdn_case("triton", 8192, 3e-4, 1e-6),
        gdn_case("eager", 4096, 1e-7, 8e-8),  # to 1.2e-7 at 8K, spread wider than the change
        gdn_case("eager", 8192, 1.2e-7, 8e-8),
    ])
    text = conclusions(tmp_path, cases)
    found = re.search(r"grows for dq, triton T=4K → 8K: ×3\.00 \[([\d.]+), ([\d.]+)\]", text)
    assert found, text
    assert 1 < float(found.group(1)) < 3 < float(found.group(2))
    assert "no change the data can support in the other 1 of 2" in text
    assert "eager T=4K → 8K" not in text

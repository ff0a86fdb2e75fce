"""The network's per-layer model and the share of the single layer's P2P saving, on jobs stored
through the store (`service.persistence.runs.store_run`, as `gdnval run` keeps its runs): each
derived number is printed as 'estimate [low, high]' from the bootstrap over the stored
repetitions, and a number whose interval contains zero is said to be not distinguishable from
zero instead of stated as a finding."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.stored_report import REPEAT, Cases, document, repetitions, report

T = 8192
LAYERS = (4, 8)


def network_cases(layers: int, times: dict[str, tuple[float, float]]) -> Cases:
    """The checkpoint-off speed cases of one model: mode -> (fwd+bwd median, half-width)."""
    out = {}
    for mode, (median, spread) in times.items():
        p = {"kind": "speed", "mode": mode, "checkpoint": "off", "model": f"qwen35-{layers}l", "seq_len": T,
             "backend": "triton", "dtype": "bfloat16", "batch_size": 1, "warmup": 5, "repeat": REPEAT}
        out[f"speed/{mode}/ckpt-off"] = (p, {
            "fwd_bwd_ms": repetitions(median, spread),
            "fwd_ms": repetitions(median / 3, spread / 3),
            "model_layers": [float(layers)],
            "model_linear_layers": [layers * 0.75],
        })
    return out


def layer_cases(times: dict[str, tuple[float, float]]) -> Cases:
    out = {}
    for mode, (median, spread) in times.items():
        p = {"mode": mode, "backend": "triton", "dtype": "bfloat16", "batch": 1, "seq_len": T,
             "valid_len": None, "shards": None, "warmup": 5, "repeat": REPEAT}
        out[f"{mode}_triton_T{T}_B1"] = (p, {"fwd_bwd_ms": repetitions(median, spread),
                                             "fwd_ms": repetitions(median / 3, spread / 3)})
    return out


# Ulysses 100 ms at 4 layers, 180 at 8: 20 ms per layer, 20 fixed; P2P 90 and 150: 15 and 30.
SEPARATED = {
    4: {"ulysses": (100.0, 0.5), "p2p": (90.0, 0.5)},
    8: {"ulysses": (180.0, 0.5), "p2p": (150.0, 0.5)},
}
# the same medians, repetitions spread ±60 ms: every run overlaps every other
OVERLAPPING = {n: {m: (med, 60.0) for m, (med, _) in modes.items()} for n, modes in SEPARATED.items()}
LAYER = {"ulysses": (10.0, 0.05), "p2p": (8.0, 0.05)}  # the single layer saves 2 ms


def campaign(
    tmp: Path, times: dict[int, dict[str, tuple[float, float]]], layer: dict[str, tuple[float, float]] = LAYER
) -> dict[str, str]:
    docs = [document("network", 2, "c" * 40, network_cases(n, times[n])) for n in LAYERS]
    docs.append(document("cp-layer", 2, "c" * 40, layer_cases(layer)))
    return report(tmp, docs)


def cells(section: str, mode: str) -> tuple[str, str]:
    row = re.search(rf"\| CP2 \| 8K/4K \| {mode} \| 4 → 8 \| [^|]* \| ([^|]*) \| ([^|]*) \|", section)
    assert row, section
    return row.group(1).strip(), row.group(2).strip()


def interval(text: str) -> tuple[float, float, float]:
    found = re.fullmatch(r"(-?[\d.]+) \[(-?[\d.]+), (-?[\d.]+)\](, not distinguishable from zero)?", text)
    assert found, text
    return float(found.group(1)), float(found.group(2)), float(found.group(3))


def test_well_separated_runs_give_a_finding_with_its_interval(tmp_path: Path) -> None:
    got = campaign(tmp_path, SEPARATED)
    model = got["Network per-layer model"]
    per, fixed = cells(model, "ulysses")
    for text, value in ((per, 20.0), (fixed, 20.0)):
        est, low, high = interval(text)
        assert est == pytest.approx(value) and 0 < low < est < high
        assert "not distinguishable" not in text
    assert re.search(r"P2P saves per layer: U − P 5\.000 \[[\d.]+, [\d.]+\] ms", model), model
    # the share: (100 − 90) / (3 GDN layers × 2 ms) = 166.7 %, its interval excluding zero
    share = re.search(
        r"CP2 at 8K, 4 layers: 166\.7% \[([\d.]+)%, ([\d.]+)%\] \(the network saves", got["Conclusions"]
    )
    assert share, got["Conclusions"]
    assert 0 < float(share.group(1)) < 166.7 < float(share.group(2))


def test_overlapping_runs_are_not_distinguishable_from_zero(tmp_path: Path) -> None:
    got = campaign(tmp_path, OVERLAPPING)
    model = got["Network per-layer model"]
    # P2P's fixed cost: 90 − 15 × 4 = 30 ms, from runs spread ±60 ms
    _, fixed = cells(model, "p2p")
    est, low, high = interval(fixed)
    assert est == pytest.approx(30.0) and low < 0 < high
    assert fixed.endswith(", not distinguishable from zero")
    assert "per-layer difference U − P 5.000 [" in model and "is not distinguishable from zero" in model
    assert "P2P saves" not in model
    number = r"-?[\d.]+"
    unit_then_reading = rf"fixed U − P {number} \[{number}, {number}\] ms(, not distinguishable from zero)?\."
    fixed_diff = re.search(unit_then_reading, model)
    assert fixed_diff, model  # the unit beside the number, the reading after it
    share = re.search(r"CP2 at 8K, 4 layers: 166\.7% \[(-?[\d.]+)%, (-?[\d.]+)%\], not distinguishable from "
                      r"zero \(the network saves", got["Conclusions"])
    assert share, got["Conclusions"]
    assert float(share.group(1)) < 0 < float(share.group(2))


def test_a_share_of_a_saving_not_distinguishable_from_zero_is_not_informative(tmp_path: Path) -> None:
    got = campaign(tmp_path, SEPARATED, layer={"ulysses": (10.0, 3.0), "p2p": (9.9, 3.0)})
    assert re.search(
        r"CP2 at 8K, 4 layers: not informative: the single layer's P2P saving 0\.100 \[-[\d.]+, [\d.]+\] ms "
        r"is not distinguishable from zero\.",
        got["Conclusions"],
    ), got["Conclusions"]


def test_the_same_stored_runs_give_the_same_intervals(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = campaign(tmp_path / "a", OVERLAPPING)["Network per-layer model"]
    b = campaign(tmp_path / "b", OVERLAPPING)["Network per-layer model"]
    assert a == b and "[" in a

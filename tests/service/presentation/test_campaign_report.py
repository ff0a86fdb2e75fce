"""The campaign report on planted jobs (every section, its columns and conventions, the judgment
behind every comparison) and on jobs real suites produced, stored through the dispatcher's sink
(its numbers against the store's statistics).

Planted jobs carry values per repetition (tests/support/planted_report.py), summarised by the
store's own statistics, so the medians the report prints are the ones a real job would store:
the CP4 P2P/Ulysses pair at 64K is the hand-written report's, U = 160.283 ms and P = 132.973 ms,
whose gain is 17.0 %.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from service.persistence import summaries as summary_store
from service.presentation import report_build
from service.presentation.campaign_report import campaign_report_markdown, public_links
from service.presentation.report_markdown import LINE, render
from service.presentation.report_model import MAX_COLUMNS, Links, ReportJob, Table
from tests.support.paths import RESULTS
from tests.support.planted_report import acc, case, job, memory, metric, timed
from tests.support.report_markdown import joined, linked, sections, table, tables
from tests.support.run_json import store_run
from workers.stats import summarise

BASE = "https://gdnval.example.org"


def cp_params(mode: str, T: int, **kw: Any) -> dict[str, Any]:
    return {
        "mode": mode,
        "backend": "triton",
        "dtype": "bfloat16",
        "batch": 1,
        "seq_len": T,
        "valid_len": None,
        "shards": None,
        "warmup": 5,
        "repeat": 20,
        **kw,
    }


def cp_job(job_id: int, world: int, times: dict[tuple[str, int], tuple[float, float]]) -> ReportJob:
    cases = []
    for (mode, T), (f, fb) in times.items():
        err = 5.9e-3 if T <= 16384 else 6.0e-3
        cases.append(
            case(
                f"{mode}_triton_T{T}_B1",
                cp_params(mode, T),
                *timed(f, fb),
                memory("peak_allocated_bytes", 2000 + (12 if mode == "p2p" else 0)),
                memory("peak_reserved_bytes", 3000),
                acc("output", err),
                acc("input_grad", err),
                acc("param_grad", err),
                metric("grad_norm_rel_err", [2e-4], "ratio", "accuracy", 1e-2),
                metric("padding_output_max_abs", [0.0], "abs", "check", 0.0),
            )
        )
    for mode in ("ulysses", "p2p"):
        cases.append(
            case(
                f"{mode}_triton_T8192_B2_valid7777",
                cp_params(mode, 8192, batch=2, valid_len=7777),
                acc("output", 5e-3),
                acc("input_grad", 5e-3),
                acc("param_grad", 5e-3),
                metric("padding_output_max_abs", [0.0], "abs", "check", 0.0),
            )
        )
    return job(job_id, "cp-layer", world, cases)


def gdn_job() -> ReportJob:
    cases = []
    for T, (eager_ms, triton_ms) in {8192: (126.5, 10.0), 16384: (447.4, 20.0)}.items():
        for backend, fb in (("eager", eager_ms), ("triton", triton_ms)):
            p = {
                "backend": backend,
                "seq_len": T,
                "mode": "stateful",
                "qk_heads": 32,
                "baseline": "eager",
                "warmup": 5,
                "repeat": 20,
                "eager_warmup": 3,
                "eager_repeat": 10,
            }
            ms = [
                *timed(fb / 3, fb, spread=fb / 200),
                memory("peak_bytes", 384 if backend == "eager" else 100),
            ]
            if backend == "triton":
                ms += [
                    acc(t, 5.86e-3 if (t, T) == ("dq", 16384) else 3e-3, 5e-3 if t != "dq" else 1e-2)
                    for t in ("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0")
                ]
                ms += [metric(f"{t}_finite", [1.0], "bool", "check", 1.0, "higher") for t in ("o", "dq")]
            cases.append(case(f"T{T}_stateful_{backend}", p, *ms))
    return job(2, "gdn-op", 1, cases)


def network_job(job_id: int, world: int, layers: int = 4, scale: float = 1.0) -> ReportJob:
    cases = []
    model = f"hybrid-{layers}"  # a name without its layer count: the speed cases record it
    facts = [  # the suite records them in its speed cases only
        metric("model_layers", [float(layers)], "count", "check"),
        metric("model_linear_layers", [layers * 0.75], "count", "check"),
    ]
    for mode, off, full in (("ulysses", 880.0, 1115.0), ("p2p", 802.3, 1020.0)):
        for ck, fb, peak in (("off", off * scale, 30000), ("full", full * scale, 10530)):
            p = {
                "kind": "speed",
                "mode": mode,
                "checkpoint": ck,
                "model": model,
                "seq_len": 16384 * world,
                "warmup": 5,
                "repeat": 20,
            }
            cases.append(
                case(
                    f"speed/{mode}/ckpt-{ck}",
                    p,
                    *timed(fb * 0.3, fb),
                    metric("step_ms", [fb + 10] * 5),
                    memory("peak_allocated_bytes", peak),
                    memory("peak_reserved_bytes", peak + 4000),
                    *facts,
                )
            )
        p = {
            "kind": "trajectory",
            "mode": mode,
            "checkpoint": "off",
            "model": model,
            "seq_len": 16384 * world,
        }
        rel = [1e-4, 3e-4, 2e-4]
        cases.append(
            case(
                f"traj/{mode}/ckpt-off",
                p,
                metric("ref_loss", [10.7, 5.0, 1.483], "nats", "trajectory"),
                metric("ref_grad_norm", [4.5, 3.0, 2.0], "norm", "trajectory"),
                metric("bf16_loss_rel_err", rel, "ratio", "trajectory", 4e-4),
                metric("bf16_loss_max_rel", [max(rel)], "ratio", "trajectory", 4e-4),
                metric("bf16_loss_max_abs", [1.7e-3], "abs", "trajectory"),
                metric("bf16_grad_norm_rel_err", [1e-3, 3.9e-3], "ratio", "trajectory", 4e-3),
                metric("bf16_grad_norm_max_rel", [3.9e-3], "ratio", "trajectory", 4e-3),
                metric("bf16_grad_norm_max_abs", [0.018], "abs", "trajectory"),
            )
        )
    p = {"kind": "determinism", "mode": "p2p", "checkpoint": "off", "determinism_steps": 10, "model": model}
    cases.append(
        case(
            "determinism/p2p",
            p,
            *(
                metric(f"det_{w}_identical", [1.0], "bool", "check", 1.0, "higher")
                for w in ("loss", "grad_norm", "params")
            ),
            metric("det_max_param_diff", [0.0], "abs", "accuracy", 0.0),
        )
    )
    return job(job_id, "network", world, cases)


def campaign(device: str = "cuda") -> list[ReportJob]:
    cap = job(
        1,
        "capability",
        1,
        [
            case(
                "triton_available_T65536_hqk16",
                {},
                metric("triton_available", [1.0], "bool", "check", 1.0, "higher"),
            ),
            case("failfast_backend_auto", {}, status="expected_error", expected="UnsupportedGDNRequest"),
        ],
    )
    cp4 = cp_job(
        3,
        4,
        {
            ("ulysses", 65536): (55.7, 160.283),
            ("p2p", 65536): (50.12, 132.973),
            ("all_gather", 65536): (300.0, 900.0),
            ("ulysses", 16384): (20.0, 50.0),
            ("p2p", 16384): (18.0, 42.8),
        },
    )
    cp8 = cp_job(4, 8, {("ulysses", 131072): (80.0, 240.0), ("p2p", 131072): (60.0, 150.0)})
    stab = job(
        7,
        "stability",
        4,
        [
            case(
                f"passes/{m}",
                {"mode": m},
                metric("passes_done", [20.0], "count", "check"),
                metric("finite", [1.0], "bool", "check", 1.0, "higher"),
                metric("order_checks", [120.0], "count", "check"),
                metric("pass_ms", [300.0]),
                memory("memory_growth_bytes", 0.0),
            )
            for m in ("ulysses", "p2p")
        ],
    )
    prof = job(
        8,
        "profile",
        4,
        [
            case(
                f"trace/{m}",
                {"mode": m},
                metric("trace_events", [1234.0], "count", "check"),
                metric("comm_ms", [12.0 if m == "p2p" else 20.0]),
                metric("compute_ms", [80.0]),
                metric("comm_overlap_share", [0.25], "ratio", "check", direction="higher"),
                metric(f"coll_{'send_recv' if m == 'p2p' else 'all_to_all'}_ms", [6.0]),
                metric(f"coll_{'send_recv' if m == 'p2p' else 'all_to_all'}_calls", [48.0], "count", "check"),
            )
            for m in ("ulysses", "p2p")
        ],
        artifacts=("rank0/trace-ulysses.trace.json.gz", "rank0/trace-p2p.trace.json.gz"),
    )
    jobs = [
        cap,
        gdn_job(),
        cp4,
        cp8,
        network_job(5, 4),
        network_job(6, 8),
        network_job(9, 4, 8, 1.9),
        stab,
        prof,
    ]
    for j in jobs:
        j.data.device = device
    return jobs


def markdown(jobs: list[ReportJob], base: str | None = BASE) -> str:
    return render(report_build.build(jobs, (), Links(base), "campaign"))


SECTIONS = {
    "Environment and backends": ["job", "suite", "preset", "device", "software", "commit", "verdict"],
    "Capability and fail-fast": ["case", "outcome", "bounded checks holding"],
    "Single-device GDN accuracy": [
        "T",
        "backend",
        "o",
        "final state",
        "dq",
        "dk",
        "dv",
        "dg",
        "dbeta",
        "dh0",
        "finite",
    ],
    "Single-device GDN speed and memory": [
        "T",
        "backend",
        "fwd",
        "fwd+bwd",
        "fwd+bwd p90",
        "fwd+bwd min",
        "bwd estimate",
        "speed-up vs eager",
        "incr. peak",
        "peak vs eager",
    ],
    "CP layer accuracy": [
        "CP",
        "mode",
        "T",
        "batch",
        "output",
        "input grad",
        "param grads",
        "grad-norm rel err",
    ],
    "CP layer speed and memory": [
        "CP",
        "T",
        "batch",
        "mode",
        "fwd",
        "fwd+bwd",
        "fwd+bwd p90",
        "fwd+bwd min",
        "bwd estimate",
        "peak allocated",
        "peak reserved",
        "gain vs Ulysses",
    ],
    "CP weak scaling": ["world sizes", "local T", "mode", "fwd+bwd before", "fwd+bwd after", "growth"],
    "Network trajectories": [
        "topology",
        "layers",
        "mode",
        "steps",
        "loss ref range",
        "loss max abs",
        "loss max rel",
        "loss mean rel",
    ],
    "Network speed and memory": [
        "layers",
        "topology",
        "global/local T",
        "mode",
        "fwd",
        "fwd+bwd",
        "fwd+bwd p90",
        "fwd+bwd min",
        "bwd estimate",
        "step",
        "peak allocated",
        "peak reserved",
        "gain vs Ulysses",
    ],
    "Network weak scaling": [
        "layers",
        "world sizes",
        "local T",
        "mode",
        "fwd+bwd before",
        "fwd+bwd after",
        "growth",
    ],
    "Network per-layer model": [
        "topology",
        "global/local T",
        "mode",
        "layers",
        "fwd+bwd",
        "per layer",
        "fixed",
    ],
    "Activation checkpoint off vs full": [
        "layers",
        "topology",
        "mode",
        "fwd+bwd off",
        "fwd+bwd full",
        "time",
        "peak allocated",
        "gain vs Ulysses off",
        "gain vs Ulysses full",
    ],
    "Deterministic pair": [
        "topology",
        "mode",
        "steps",
        "loss identical",
        "grad-norm identical",
        "params identical",
        "max param diff",
    ],
    "Stability": [
        "topology",
        "mode",
        "passes",
        "all finite",
        "order checks",
        "pass median (ms)",
        "memory growth",
        "outcome",
    ],
    "Profile traces": ["topology", "mode", "trace", "events", "communication", "compute", "overlap"],
    "Conclusions": None,
}


def test_every_section_in_the_seed_order_with_its_columns() -> None:
    md = markdown(campaign())
    got = sections(md)
    assert list(got) == list(SECTIONS)
    for title, header in SECTIONS.items():
        assert got[title].strip(), title  # no empty section
        if header is not None:
            assert joined(got[title])[0][: len(header)] == header, title
    assert "_No" not in md and "No data" not in md and "tiny" not in md


def test_paste_ready_markdown_fits_a_pull_request_comment() -> None:
    """Prose wrapped at LINE characters, at most MAX_COLUMNS columns per table, long tables folded."""
    md = markdown(campaign())
    prose = [ln for ln in md.splitlines() if not ln.startswith(("|", "<summary>"))]
    assert max(len(ln) for ln in prose) <= LINE
    widths = [len(h) for text in sections(md).values() for h, _ in tables(text)]
    assert widths and max(widths) <= MAX_COLUMNS
    t = Table(["k", *"abcdefghij"], [["x", *range(10)]], keys=1)
    parts = t.parts()
    assert [p.header for p in parts] == [["k", *"abcde"], ["k", *"fghij"]]
    many = render(
        report_build.Report(
            "t", [], [report_build.Section("s", "S", [Table(["a"], [[i] for i in range(20)])])]
        )
    )
    assert "<details>\n<summary>S: 20 rows (a)</summary>\n\n| a |" in many and many.count("</details>") == 1


def test_the_gain_is_time_saved_with_its_interval_and_the_speed_up_a_factor() -> None:
    got = sections(markdown(campaign()))
    _, rows = joined(got["CP layer speed and memory"])
    by = {(r["CP"], r["T"], r["mode"]): r for r in rows}
    # (160.283 − 132.973) / 160.283, significant: the value with its interval
    assert re.fullmatch(
        r"\+17\.0% \(95% CI \+1\d\.\d% to \+1\d\.\d%\)", by[("CP4", "64K", "p2p")]["gain vs Ulysses"]
    )
    assert (
        by[("CP4", "64K", "p2p")]["fwd+bwd"] == "132.973"
        and by[("CP4", "64K", "ulysses")]["fwd+bwd"] == "160.283"
    )
    assert by[("CP4", "64K", "ulysses")]["gain vs Ulysses"] == "–"
    assert by[("CP4", "64K", "all_gather")]["gain vs Ulysses"].startswith("-461.5% (")  # slower: negative
    assert by[("CP4", "16K", "p2p")]["gain vs Ulysses"].startswith("+14.4% (")
    _, rows = joined(got["Single-device GDN speed and memory"])
    triton = {r["T"]: r for r in rows if r["backend"] == "triton"}
    assert re.match(
        r"12\.\d× faster \(95% CI 12\.\d–12\.\d×\)$", triton["8K"]["speed-up vs eager"]
    )  # 126.5 / 10
    assert triton["8K"]["peak vs eager"] == "3.84× lower" and triton["8K"]["incr. peak"] == "100.0 MiB"
    assert "warm-up 5, repeat 20; eager warm-up 3, repeat 10" in got["Single-device GDN speed and memory"]
    assert "(warm-up 5, repeat 20)" in got["CP layer speed and memory"]
    _, rows = joined(got["Network speed and memory"])
    p2p8 = next(r for r in rows if r["topology"] == "CP8" and r["mode"] == "p2p")
    assert (
        p2p8["gain vs Ulysses"].startswith(f"{(880.0 - 802.3) / 880.0:+.1%} (")
        and p2p8["global/local T"] == "128K/16K"
    )


def test_the_backward_estimate_is_the_difference_of_the_shown_medians() -> None:
    got = sections(markdown(campaign()))
    checked = 0
    for title in (
        "Single-device GDN speed and memory",
        "CP layer speed and memory",
        "Network speed and memory",
    ):
        _, rows = joined(got[title])
        for r in rows:
            assert abs(float(r["bwd estimate"]) - (float(r["fwd+bwd"]) - float(r["fwd"]))) <= 1.5e-3, (
                title,
                r,
            )
            checked += 1
    assert checked == 4 + 7 + 6  # gdn-op, cp-layer CP4 + CP8, network 4 layers CP4 + CP8 and 8 layers CP4


def test_p90_and_min_are_the_stored_statistics() -> None:
    _, rows = joined(sections(markdown(campaign()))["CP layer speed and memory"])
    p2p = next(r for r in rows if (r["CP"], r["T"], r["mode"]) == ("CP4", "64K", "p2p"))
    stats = next(c for c in campaign()[2].data.cases if c.name == "p2p_triton_T65536_B1").metrics[
        "fwd_bwd_ms"
    ]
    assert stats == summarise(
        list(campaign()[2].data.cases[1].values["fwd_bwd_ms"]),
        "lower",
        metric="fwd_bwd_ms",
        unit="ms",
        kind="time",
        samples=11,
        ranks=1,
    )
    assert (p2p["fwd+bwd p90"], p2p["fwd+bwd min"]) == (f"{stats.p90:.3f}", f"{stats.min:.3f}")


def test_weak_scaling_the_layer_model_checkpoint_trajectories_and_padding() -> None:
    got = sections(markdown(campaign()))
    _, rows = table(got["CP weak scaling"])
    assert [(r["world sizes"], r["local T"], r["mode"]) for r in rows] == [
        ("CP4 → CP8", "16K", "ulysses"),
        ("CP4 → CP8", "16K", "p2p"),
    ]
    assert rows[0]["growth"].startswith(f"{(240.0 - 160.283) / 160.283:+.1%} (95% CI ")
    _, rows = table(got["Network weak scaling"])
    assert {(r["layers"], r["world sizes"], r["mode"]) for r in rows} == {
        ("4", "CP4 → CP8", m) for m in ("ulysses", "p2p")
    }
    assert all(r["growth"].startswith("no change the data can support") for r in rows)  # the same times
    _, rows = table(got["Network per-layer model"])
    u = next(r for r in rows if r["mode"] == "ulysses")
    # 4 layers 880 ms, 8 layers 1672 ms: 198 ms per layer and 88 ms fixed, each with its interval
    assert u["layers"] == "4 → 8"
    for cell, value in ((u["per layer"], (1672.0 - 880.0) / 4), (u["fixed"], 880.0 - 792.0)):
        low, high = re.fullmatch(rf"{value:.3f} \[(\S+), (\S+)\]", cell).groups()  # type: ignore[union-attr]
        assert 0 < float(low) < value < float(high)  # well separated runs: a finding, no "zero" caveat
    assert "P2P saves per layer: U − P 17.483 [" in " ".join(got["Network per-layer model"].split())
    _, rows = joined(got["Activation checkpoint off vs full"])
    uly4 = next(r for r in rows if r["topology"] == "CP4" and r["mode"] == "ulysses" and r["layers"] == "4")
    assert (
        uly4["time"].startswith(f"{(1115.0 - 880.0) / 880.0:+.1%} (") and uly4["peak allocated"] == "-64.9%"
    )
    _, rows = joined(got["Network trajectories"])
    assert rows[0]["loss ref range"] == "[1.483, 10.7]" and rows[0]["loss max rel"] == "3.000e-04"
    assert rows[0]["loss mean rel"] == "2.000e-04" and rows[0]["steps"] == "3" and rows[0]["layers"] == "4"
    assert "Padding output exactly 0: yes in 4 of 4 padding case(s)." in got["CP layer accuracy"]
    _, rows = joined(got["Single-device GDN accuracy"])
    assert {r["T"]: r["dq"] for r in rows} == {"8K": "3.000e-03", "16K": "5.860e-03"}  # worst over seeds
    _, rows = table(got["Profile traces"])
    assert [(r["mode"], r["trace"], r["communication"], r["overlap"]) for r in rows] == [
        ("ulysses", "rank0/trace-ulysses.trace.json.gz", "20.000", "25%"),
        ("p2p", "rank0/trace-p2p.trace.json.gz", "12.000", "25%"),
    ]
    _, rows = table(got["Profile traces"], 1)
    assert [(r["collective"], r["calls"], r["per call"]) for r in rows] == [
        ("all to all", "48", "0.125"),
        ("send recv", "48", "0.125"),
    ]


def test_conclusions_are_computed_with_their_rules() -> None:
    text = sections(markdown(campaign()))["Conclusions"]
    flat = " ".join(text.split())
    assert (
        "Single-device GDN: worst relative-L2 5.860e-03 (dq, triton T=16K, bound 0.01); every value within "
        "its metric's bound; grows for dq, triton T=8K → 16K: ×1.95 ["
    ) in flat  # 3e-3 → 5.86e-3 over the seeds of one backend, mode and heads
    assert "no change the data can support in the other 7 of 8" in flat
    assert re.search(
        r"Single-device speed-up triton vs eager \(fwd\+bwd\): 12\.\d× faster \(95% CI [^)]*\) at 8K; "
        r"22\.4× faster \(95% CI [^)]*\) at 16K; triton faster at every shape\.",
        flat,
    )
    assert re.search(
        r"CP layer CP4 B=1, P2P gain over Ulysses: \+14\.4% \([^)]*\) at 16K; \+17\.0% \([^)]*\) at "
        r"64K; P2P faster at every shape\.",
        flat,
    ), flat
    assert "output: both within 0.01: p2p 0.006, ulysses 0.006" in flat
    assert re.search(
        r"CP layer weak scaling CP4 → CP8 at local 16K: fwd\+bwd growth p2p \+12\.8% \([^)]*\); "
        r"ulysses \+49\.7% \([^)]*\); P2P grows less than Ulysses",
        flat,
    )
    # 3 of the 4 layers are GDN layers: the network saves 77.7 ms of 3 × 27.31 ms
    assert (
        f"Share of the single-layer P2P saving the network keeps, CP4 at 64K, 4 layers: "
        f"{(880.0 - 802.3) / (3 * (160.283 - 132.973)):.1%}"
    ) in flat
    assert "Every bound holds; no case errored." in flat

    jobs = campaign()
    bad = jobs[2].data.cases[0]
    bad.put(metric("output_rel_l2", [0.02], "ratio", "accuracy", 1e-2))
    jobs[2].data.cases.append(
        case(
            "p2p_triton_T32768_B1",
            cp_params("p2p", 32768),
            status="error",
            error="Traceback ...\nRuntimeError: NCCL timeout",
        )
    )
    text = sections(markdown(jobs))["Conclusions"]
    flat = " ".join(text.split())
    assert (
        "CP layer: worst relative-L2 0.02 (output, triton T=64K, bound 0.01); 1 value(s) beyond their bound, "
        "the furthest 0.02 > 0.01 (output, triton T=64K): FAILS"
    ) in flat
    assert "- 2 case(s) failed a bound or errored:\n" in text
    assert f"Failed: cp-layer #3 {bad.name}: out of bound (output_rel_l2)." in flat
    assert "cp-layer #3 p2p_triton_T32768_B1: error (RuntimeError: NCCL timeout)" in flat


def test_the_share_of_the_layer_saving_the_network_keeps() -> None:
    """The network's P2P saving over its GDN layers × the single layer's at the same shape."""
    cp4 = cp_job(3, 4, {("ulysses", 65536): (55.7, 160.283), ("p2p", 65536): (50.12, 132.973)})
    for c in cp4.data.cases:
        c.params["backend"] = "triton"
    net = network_job(5, 4)
    for c in net.data.cases:
        c.params["backend"], c.params["dtype"] = "triton", "bfloat16"
    flat = " ".join(sections(markdown([cp4, net]))["Conclusions"].split())
    one = 160.283 - 132.973
    share = (880.0 - 802.3) / (3 * one)  # 3 of the 4 layers are GDN layers
    found = re.search(
        rf"Share of the single-layer P2P saving the network keeps, CP4 at 64K, 4 layers: {share:.1%} "
        rf"\[(\S+)%, (\S+)%\] \(the network saves {880.0 - 802.3:.3f} \[[^]]*\] ms against 3 GDN "
        rf"layers × {one:.3f} \[",
        flat,
    )
    assert found, flat
    assert float(found.group(1)) < 100 * share < float(found.group(2))
    alone = sections(markdown([net]))
    assert (
        "Share of the single-layer P2P saving the network keeps: no cp-layer Ulysses and P2P cases"
        in " ".join(alone["Not run"].split())
    )


def test_own_backends_against_the_peers_timed_beside_them() -> None:
    """Each own backend (distribution gdnval) against each peer of the same job and shape."""
    gdn = gdn_job()
    for T, (fwd, fb, mib) in {8192: (4.0, 12.5, 121.0), 16384: (9.0, 16.0, 250.0)}.items():
        p = {**next(c.params for c in gdn.data.cases if c.params["seq_len"] == T), "backend": "fla"}
        gdn.data.cases.append(
            case(f"T{T}_stateful_fla", p, *timed(fwd, fb, spread=fb / 200), memory("peak_bytes", mib))
        )
    flat = " ".join(sections(markdown([gdn]))["Conclusions"].split())
    # triton at 8K: 10 ms against fla's 12.5 (1.25× faster), at 16K 20 ms against 16 (0.8×: slower)
    assert re.search(
        r"Single-device triton against fla \(fwd\+bwd, triton as the candidate\): 1\.25× faster "
        r"\([^)]*\) at 8K; 0\.8× slower \([^)]*\) at 16K; no claim across shapes \(2 of 2 significant\)\.",
        flat,
    ), flat
    assert "against eager" not in flat and "fla against" not in flat


def test_links_only_from_the_public_base_url() -> None:
    with_base = markdown(campaign())
    targets = re.findall(r"\]\(([^)]*)\)", with_base)
    assert targets and all(t.startswith(BASE + "/") for t in targets)
    assert (
        f"[`rank0/trace-p2p.trace.json.gz`]({BASE}/api/v1/jobs/8/artifacts/rank0/trace-p2p.trace.json.gz)"
        in with_base
    )
    for base in (None, "http://127.0.0.1:8000", "http://localhost:8000/"):
        md = render(report_build.build(campaign(), (), public_links(base), "campaign"))
        assert "](" not in md and "127.0.0.1" not in md and "localhost" not in md, base
        assert "`rank0/trace-p2p.trace.json.gz`" in md  # the trace named, without a link


def test_public_links_read_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.settings import Settings

    monkeypatch.setenv("GDNVAL_PUBLIC_URL", "https://results.example.org/gdnval/")
    assert public_links(None) == Links("https://results.example.org/gdnval")
    assert public_links("https://other.example.org") == Links("https://other.example.org")
    monkeypatch.delenv("GDNVAL_PUBLIC_URL")
    assert public_links(None) == Links(None)
    with pytest.raises(ValueError, match="loopback host"):
        Settings(public_url="http://127.0.0.1:8000")


def test_a_column_without_values_is_left_out_the_keys_always_stay() -> None:
    t = Table(["T", "gain", "fwd", "note"], [["8K", "–", "1.0", ""], ["16K", " – ", "2.0", "x"]])
    kept = t.without_empty_columns()
    assert kept.header == ["T", "fwd", "note"] and [[c.text for c in r] for r in kept.rows] == [
        ["8K", "1.0", ""],
        ["16K", "2.0", "x"],
    ]
    assert Table(["T"], [["–"]]).without_empty_columns().header == ["T"]
    with pytest.raises(ValueError, match="a row of 1 cells under the header"):
        Table(["a", "b"], [["x"]])


def test_cpu_times_are_marked_as_noise_and_sections_without_data_say_why() -> None:
    md = markdown([j for j in campaign("cpu") if j.suite in ("cp-layer", "gdn-op")])
    got = sections(md)
    assert list(got) == [
        "Environment and backends",
        "Single-device GDN accuracy",
        "Single-device GDN speed and memory",
        "CP layer accuracy",
        "CP layer speed and memory",
        "CP weak scaling",
        "Not run",
        "Conclusions",
    ]
    head = md.split("## ")[0]
    assert "come from CPU ranks" in head and "noisy" in head
    assert "0.0 MiB" not in md
    _, rows = joined(got["CP layer speed and memory"])
    assert {r["peak allocated"] for r in rows} == {r["peak reserved"] for r in rows} == {"not tracked"}
    # 17% saved, well apart, but within a CPU time's minimum effect (a doubling): no claim, and why
    gain = next(r for r in rows if (r["CP"], r["T"], r["mode"]) == ("CP4", "64K", "p2p"))["gain vs Ulysses"]
    assert re.fullmatch(r"no significant difference \(95% CI \+1\d\.\d% to \+1\d\.\d%; within the "
                        r"±100% minimum effect\)", gain), gain
    header, rows = joined(got["Single-device GDN speed and memory"])
    assert {r["incr. peak"] for r in rows} == {"not tracked"}
    assert "peak vs eager" not in header and "speed-up vs eager" in header
    assert "- Single-device memory: the device keeps no allocator statistics (cpu)." in got["Not run"]
    one = markdown([campaign()[2]])  # the layer at one world size: weak scaling cannot run
    assert "- CP weak scaling: it needs one local length at two world sizes; these jobs ran CP4 only." in one
    assert render(report_build.build([], (), Links(BASE), "empty")).strip() == "# empty"


def test_a_difference_is_a_conclusion_only_where_its_interval_supports_it(engine) -> None:
    """The acceptance test of the judgment in the report: two CP4 jobs' worth of samples stored
    per rank, one shape where P2P and Ulysses overlap (the same distribution) and one where they
    are well apart: only the second becomes a claim, in the table and in the conclusions."""
    from tests.support.planted_report import plant_job

    rng = __import__("numpy").random.default_rng(3)
    reps = 20
    cases = {}
    for mode, T, centre in (
        ("ulysses", 16384, 50.0),
        ("p2p", 16384, 50.0),
        ("ulysses", 65536, 160.0),
        ("p2p", 65536, 133.0),
    ):
        per_rank = [centre * (1 + 0.04 * rng.standard_normal(reps)) for _ in range(4)]
        cases[f"{mode}_triton_T{T}_B1"] = (
            cp_params(mode, T),
            {"fwd_bwd_ms": per_rank, "fwd_ms": [x * 0.35 for x in per_rank]},
        )
    job_id = plant_job(engine, "cp-layer", 4, "cuda", cases)
    with Session(engine) as s:
        md = campaign_report_markdown(s, [job_id], base_url=BASE)
    got = sections(md)
    _, rows = joined(got["CP layer speed and memory"])
    gains = {r["T"]: r["gain vs Ulysses"] for r in rows if r["mode"] == "p2p"}
    assert gains["16K"].startswith("no significant difference (95% CI ")
    assert re.fullmatch(r"\+1\d\.\d% \(95% CI \+\d+\.\d% to \+\d+\.\d%\)", gains["64K"]), gains
    flat = " ".join(got["Conclusions"].split())
    line = re.search(r"CP layer CP4 B=1, P2P gain over Ulysses: ([^-]*)", flat)
    assert line, flat
    assert re.search(
        r"no significant difference \(95% CI [^)]*\) at 16K; \+1\d\.\d% \(95% CI [^)]*\) at 64K; "
        r"no claim across shapes \(1 of 2 significant\)\.",
        flat,
    ), flat
    assert "faster at every shape" not in flat and "slower at every shape" not in flat


# ------------------------------------------------------------------------ real jobs, stored

STORED = (
    "cp_layer_cp2_h200x2.json",
    "network_speed_cp2_h200x2.json",
    "network_traj200_cp2_T32768_b_h200x2.json",
    "stability_cp2_h200x2.json",
    "cp_layer_quick_cpu_w2.json",
)


@pytest.mark.stores("sqlite")
def test_the_report_of_stored_jobs_prints_the_stored_statistics(engine, tmp_path: Path) -> None:
    ids = [store_run(engine, RESULTS / name) for name in STORED]
    with Session(engine) as s:
        md = campaign_report_markdown(s, ids, base_url=BASE)
        stored = {j: {c.name: c for c in summary_store.case_summaries(s, j)} for j in ids}
    got = sections(md)
    assert list(got) == [
        "Environment and backends",
        "CP layer accuracy",
        "CP layer speed and memory",
        "Network trajectories",
        "Network speed and memory",
        "Activation checkpoint off vs full",
        "Stability",
        "Not run",
        "Conclusions",
    ]
    assert "_No" not in md and "127.0.0.1" not in md
    h200, checked = stored[ids[0]], 0
    header, rows = joined(got["CP layer speed and memory"])
    mode = next(h for h in header if h.startswith("mode"))  # "mode (backend, dtype)": both vary
    for (job_id, fingerprint), r in zip(linked(got["CP layer speed and memory"]), rows, strict=True):
        if job_id != ids[0]:
            continue
        c = next(c for c in h200.values() if c.fingerprint == fingerprint)
        fb, f = c.metrics["fwd_bwd_ms"], c.metrics["fwd_ms"]
        assert (r["fwd"], r["fwd+bwd"], r["fwd+bwd p90"], r["fwd+bwd min"]) == (
            f"{f.median:.3f}",
            f"{fb.median:.3f}",
            f"{fb.p90:.3f}",
            f"{fb.min:.3f}",
        ), c.name
        assert r["bwd estimate"] == f"{fb.median - f.median:.3f}", c.name
        if r[mode].startswith("p2p"):
            u = h200[c.name.replace("p2p", "ulysses")].metrics["fwd_bwd_ms"].median
            gain = f"{(u - fb.median) / u:+.1%}"
            assert r["gain vs Ulysses"].startswith((gain, "no significant difference")), (c.name, gain)
        checked += 1
    assert checked == len(h200) == 8
    cpu_rows = [r for r in rows if r["peak allocated"] == "not tracked"]
    assert cpu_rows and all(r["peak reserved"] == "not tracked" and r["fwd"] != "–" for r in cpu_rows)
    _, rows = joined(got["Network trajectories"])
    row = next(r for r in rows if r["mode"] == "ulysses, ckpt off")
    traj = stored[ids[2]]["traj/ulysses/ckpt-off"].metrics
    assert row["loss ref range"] == f"[{_fmt(traj['ref_loss'].min)}, {_fmt(traj['ref_loss'].max)}]"
    assert row["loss mean rel"] == _fmt(traj["bf16_loss_rel_err"].mean)
    assert row["grad-norm max rel"] == _fmt(traj["bf16_grad_norm_max_rel"].max)
    assert row["steps"] == str(traj["ref_loss"].count) == "200"
    _, rows = table(got["Stability"])
    assert [r["passes"] for r in rows] == ["20", "20"] and all(
        r["memory growth"].endswith("MiB") for r in rows
    )
    flat = " ".join(got["Not run"].split())
    assert "CP weak scaling: it needs one local length at two world sizes; these jobs ran CP2 only." in flat
    assert (
        "Network per-layer model: it needs one shape at two layer counts; the network ran at 4 layers."
        in flat
    )


def _fmt(value: float) -> str:
    from service.presentation.numbers import fmt

    return fmt(value)


@pytest.mark.stores("sqlite")
def test_the_report_page_draws_the_sections_and_plots(db_url: str, engine, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    ids = [store_run(engine, RESULTS / name) for name in STORED]
    with TestClient(create_app(Settings(db_url=db_url, dispatch=False, executor="local"))) as client:
        resp = client.get("/reports/campaign", params=[("job", i) for i in ids])
        missing = client.get("/reports/campaign", params={"job": 999})
        none = client.get("/reports/campaign")
    assert resp.status_code == 200, resp.text[-2000:]
    html = resp.text
    for key in (
        "environment",
        "cp-accuracy",
        "cp-speed",
        "trajectories",
        "network-speed",
        "stability",
        "not-run",
    ):
        assert f'id="report-{key}"' in html, key
    assert 'data-plot="cp-time"' in html
    # one plot per quantity, every trajectory case overlaid
    assert (
        html.count('data-plot="trajectory-loss"') == 1 and html.count('data-plot="trajectory-grad_norm"') == 1
    )
    assert "<th>gain vs Ulysses</th>" in html and "`" not in re.sub(r"<svg.*?</svg>", "", html, flags=re.S)
    assert "](" not in html and f'href="/jobs/{ids[0]}#case-' in html and "<code>" in html
    assert missing.status_code == 404 and "no job 999" in missing.text
    assert none.status_code == 422


@pytest.mark.stores("sqlite")
def test_a_base_campaign_is_compared_job_by_job(engine, tmp_path: Path) -> None:
    names = ("cp_layer_cp2_h200x2.json", "stability_cp2_h200x2.json")
    base = [store_run(engine, RESULTS / n) for n in names]
    head = [store_run(engine, RESULTS / n) for n in names]
    with Session(engine) as s:
        md = campaign_report_markdown(s, head, base_job_ids=base)
        with pytest.raises(ValueError, match=r"base job \d+ ran stability at world size 2"):
            campaign_report_markdown(s, head[:1], base_job_ids=base)
    got = sections(md)
    assert list(got)[-3:] == ["Against the base", "Not run", "Conclusions"]
    header, rows = table(got["Against the base"])
    assert header == ["suite", "head job", "base job", "verdict", "cases"]
    assert [(r["suite"], r["head job"], r["base job"], r["verdict"]) for r in rows] == [
        ("cp-layer", f"#{head[0]}", f"#{base[0]}", "FAIL"),  # its input grads fail their bound on both sides
        ("stability", f"#{head[1]}", f"#{base[1]}", "pass"),
    ]
    assert "](" not in md  # no public URL configured: no links

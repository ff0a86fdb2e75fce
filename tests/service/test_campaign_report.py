"""The campaign report on planted jobs (every section, its columns and conventions) and on jobs
real suites produced, stored through the dispatcher's sink (its numbers against the store's
statistics).

Planted jobs carry values per repetition, summarised by the store's own statistics
(`workers.stats.summarise`), so the medians the report prints are the ones a real job would
store: the CP4 P2P/Ulysses pair at 64K is the hand-written report's, U = 160.283 ms and
P = 132.973 ms, whose gain is 17.0 %.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from service.persistence import summaries as summary_store
from service.persistence.summaries import CaseSummary
from service.presentation.campaign_report import campaign_report_markdown, public_links, render
from service.presentation.campaign_sections import CampaignJob, Links, Table, build_sections
from service.presentation.report import JobData
from tests.support.run_json import store_run
from workers import verdict
from workers.stats import summarise

BASE = "https://gdnval.example.org"
MIB = 1024**2
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def metric(
    name: str,
    values: list[float],
    unit: str = "ms",
    kind: str = "time",
    bound: float | None = None,
    direction: str = "lower",
) -> Any:
    """A stored metric summary of these per-idx values (already reduced over ranks)."""
    stats = summarise(values, direction, metric=name, unit=unit, kind=kind, bound=bound,
                      samples=len(values), ranks=1)
    return replace(stats, passes=verdict.judge(kind, direction, bound, stats).ok)


def case(
    name: str,
    params: dict[str, Any],
    *metrics: Any,
    status: str = "passed",
    error: str | None = None,
    expected: str | None = None,
) -> CaseSummary:
    return CaseSummary(
        0,
        name,
        f"fp{abs(hash(name)) % 10**8:08d}",
        params,
        status,
        error,
        expected,
        {m.metric: m for m in metrics},
    )


def job(
    job_id: int,
    suite: str,
    world_size: int,
    cases: list[CaseSummary],
    device: str = "cuda",
    artifacts: tuple[str, ...] = (),
) -> CampaignJob:
    info = {
        "device_name": "NVIDIA H200",
        "torch": "2.11.0",
        "triton": "3.6.0",
        "python": "3.12.3",
        "backends": [
            {"backend": "triton", "distribution": "gdnval", "version": "0.1.0", "commit": "ab" * 20}
        ],
    }
    data = JobData(
        job_id, suite, "full", "succeeded", "ab" * 20, device, world_size, None, info, cases, verdict="passed"
    )
    return CampaignJob(data, list(artifacts))


def timed(fwd: float, fwd_bwd: float, spread: float = 1.0) -> list[Any]:
    """fwd and fwd+bwd repetitions whose medians are exactly `fwd` and `fwd_bwd`."""
    return [
        metric("fwd_ms", [fwd - spread, fwd, fwd + 2 * spread]),
        metric("fwd_bwd_ms", [fwd_bwd - spread, fwd_bwd, fwd_bwd + 3 * spread]),
    ]


def memory(name: str, mib: float) -> Any:
    return metric(name, [mib * MIB], "bytes", "memory")


def acc(prefix: str, value: float, bound: float | None = 1e-2) -> Any:
    return metric(f"{prefix}_rel_l2", [value * 0.9, value], "ratio", "accuracy", bound)


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


def cp_job(job_id: int, world: int, times: dict[tuple[str, int], tuple[float, float]]) -> CampaignJob:
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


def gdn_job() -> CampaignJob:
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
            ms = [*timed(fb / 3, fb), memory("peak_bytes", 384 if backend == "eager" else 100)]
            if backend == "triton":
                ms += [
                    acc(t, 5.86e-3 if (t, T) == ("dq", 16384) else 3e-3, 5e-3 if t != "dq" else 1e-2)
                    for t in ("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0")
                ]
                ms += [metric(f"{t}_finite", [1.0], "bool", "check", 1.0, "higher") for t in ("o", "dq")]
            cases.append(case(f"T{T}_stateful_{backend}", p, *ms))
    return job(2, "gdn-op", 1, cases)


def network_job(job_id: int, world: int) -> CampaignJob:
    cases = []
    for mode, off, full in (("ulysses", 880.0, 1115.0), ("p2p", 802.3, 1020.0)):
        for ck, fb, peak in (("off", off, 30000), ("full", full, 10530)):
            p = {
                "kind": "speed",
                "mode": mode,
                "checkpoint": ck,
                "model": "qwen35-4l",
                "seq_len": 65536,
                "warmup": 5,
                "repeat": 20,
            }
            cases.append(
                case(
                    f"speed/{mode}/ckpt-{ck}",
                    p,
                    *timed(fb * 0.3, fb),
                    metric("step_ms", [fb + 10]),
                    memory("peak_allocated_bytes", peak),
                    memory("peak_reserved_bytes", peak + 4000),
                )
            )
        p = {"kind": "trajectory", "mode": mode, "checkpoint": "off", "model": "qwen35-4l", "seq_len": 65536}
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
    p = {"kind": "determinism", "mode": "p2p", "checkpoint": "off", "determinism_steps": 10}
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


def campaign(device: str = "cuda") -> list[CampaignJob]:
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
            case(f"trace/{m}", {"mode": m}, metric("trace_events", [1234.0], "count", "check"))
            for m in ("ulysses", "p2p")
        ],
        artifacts=("rank0/trace-ulysses.trace.json.gz", "rank0/trace-p2p.trace.json.gz"),
    )
    jobs = [cap, gdn_job(), cp4, cp8, network_job(5, 4), network_job(6, 8), stab, prof]
    for j in jobs:
        j.data.device = device
    return jobs


def markdown(jobs: list[CampaignJob], base: str | None = BASE) -> str:
    return render(build_sections(jobs, (), Links(base)), "campaign")


def sections(md: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", md, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def table(text: str, n: int = 0) -> tuple[list[str], list[dict[str, str]]]:
    """The n-th table of a section: its header and rows as dicts (links reduced to their text)."""
    blocks = [b for b in re.split(r"\n\s*\n", text) if b.startswith("|")]
    lines = [ln for ln in blocks[n].splitlines() if ln.startswith("|")]

    def cells(ln: str) -> list[str]:
        return [re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", c.strip()) for c in re.split(r"(?<!\\)\|", ln)[1:-1]]

    header = cells(lines[0])
    return header, [dict(zip(header, cells(ln), strict=True)) for ln in lines[2:]]


SECTIONS = {
    "Environment and backends": ["job", "suite", "preset", "device", "software", "commit", "verdict"],
    # "failing" names the failed checks; no planted case fails, so the column is left out
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
    "CP weak scaling": [
        "world sizes",
        "local T",
        "mode",
        "backend",
        "fwd+bwd before",
        "fwd+bwd after",
        "growth",
    ],
    "Network trajectories": [
        "topology",
        "layers",
        "mode",
        "steps",
        "loss ref range",
        "loss max abs",
        "loss max rel",
        "loss mean rel",
        "grad-norm ref range",
        "grad-norm max abs",
        "grad-norm max rel",
        "grad-norm mean rel",
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
    "Profile traces": None,
    "Conclusions": None,
}


def test_every_section_in_the_seed_order_with_its_columns() -> None:
    md = markdown(campaign())
    got = sections(md)
    assert list(got) == list(SECTIONS)
    for title, header in SECTIONS.items():
        assert got[title].strip(), title  # no empty section
        if header is not None:
            assert table(got[title])[0] == header, title
    assert "_No" not in md and "No data" not in md
    assert 150 < len(md.splitlines()) < 300  # paste-ready: about 250 lines for the full plan


def test_the_gain_is_time_saved_and_the_speed_up_a_factor() -> None:
    got = sections(markdown(campaign()))
    _, rows = table(got["CP layer speed and memory"])
    by = {(r["CP"], r["T"], r["mode"]): r for r in rows}
    assert by[("CP4", "64K", "p2p")]["gain vs Ulysses"] == "17.0%"  # (160.283 − 132.973) / 160.283
    assert (
        by[("CP4", "64K", "p2p")]["fwd+bwd"] == "132.973"
        and by[("CP4", "64K", "ulysses")]["fwd+bwd"] == "160.283"
    )
    assert by[("CP4", "64K", "ulysses")]["gain vs Ulysses"] == "–"
    assert (
        by[("CP4", "64K", "all_gather")]["gain vs Ulysses"] == "-461.5%"
    )  # slower: negative, never a factor
    assert by[("CP4", "16K", "p2p")]["gain vs Ulysses"] == "14.4%"
    _, rows = table(got["Single-device GDN speed and memory"])
    triton = {r["T"]: r for r in rows if r["backend"] == "triton"}
    assert triton["8K"]["speed-up vs eager"] == "12.65×" and triton["16K"]["speed-up vs eager"] == "22.37×"
    assert triton["8K"]["peak vs eager"] == "3.84× lower" and triton["8K"]["incr. peak"] == "100.0 MiB"
    assert "warm-up 5, repeat 20; eager warm-up 3, repeat 10" in got["Single-device GDN speed and memory"]
    assert "(warm-up 5, repeat 20)" in got["CP layer speed and memory"]
    _, rows = table(got["Network speed and memory"])
    p2p8 = next(r for r in rows if r["topology"] == "CP8" and r["mode"] == "p2p")
    assert p2p8["gain vs Ulysses"] == f"{(880.0 - 802.3) / 880.0:.1%}" and p2p8["global/local T"] == "64K/8K"


def test_the_backward_estimate_is_the_difference_of_the_shown_medians() -> None:
    got = sections(markdown(campaign()))
    checked = 0
    for title, text in got.items():
        if "bwd estimate" not in (SECTIONS.get(title) or []):
            continue
        _, rows = table(text)
        for r in rows:
            assert abs(float(r["bwd estimate"]) - (float(r["fwd+bwd"]) - float(r["fwd"]))) <= 1.5e-3, (
                title,
                r,
            )
            checked += 1
    assert checked == 4 + 7 + 4  # gdn-op, cp-layer CP4 + CP8, network CP4 + CP8 (checkpoint off)


def test_p90_and_min_are_the_stored_statistics() -> None:
    _, rows = table(sections(markdown(campaign()))["CP layer speed and memory"])
    p2p = next(r for r in rows if (r["CP"], r["T"], r["mode"]) == ("CP4", "64K", "p2p"))
    stats = summarise([131.973, 132.973, 135.973], "lower")
    assert (p2p["fwd+bwd p90"], p2p["fwd+bwd min"]) == (f"{stats.p90:.3f}", f"{stats.min:.3f}")


def test_scaling_checkpoint_trajectories_and_padding() -> None:
    got = sections(markdown(campaign()))
    _, rows = table(got["CP weak scaling"])
    assert [(r["world sizes"], r["local T"], r["mode"], r["growth"]) for r in rows] == [
        ("CP4 → CP8", "16K", "p2p", f"{(150.0 - 132.973) / 132.973:+.1%}"),
        ("CP4 → CP8", "16K", "ulysses", f"{(240.0 - 160.283) / 160.283:+.1%}"),
    ]
    _, rows = table(got["Activation checkpoint off vs full"])
    uly4 = next(r for r in rows if r["topology"] == "CP4" and r["mode"] == "ulysses")
    assert uly4["time"] == f"{(1115.0 - 880.0) / 880.0:+.1%}" and uly4["peak allocated"] == "-64.9%"
    p2p4 = next(r for r in rows if r["topology"] == "CP4" and r["mode"] == "p2p")
    assert p2p4["gain vs Ulysses off"] == "8.8%" and p2p4["gain vs Ulysses full"] == "8.5%"
    _, rows = table(got["Network trajectories"])
    assert rows[0]["loss ref range"] == "[1.483, 10.7]" and rows[0]["loss max rel"] == "3.000e-04"
    assert rows[0]["loss mean rel"] == "2.000e-04" and rows[0]["steps"] == "3"
    assert "Padding output exactly 0: yes in 4 of 4 padding case(s)." in got["CP layer accuracy"]
    _, rows = table(got["Single-device GDN accuracy"])
    assert {r["T"]: r["dq"] for r in rows} == {"8K": "3.000e-03", "16K": "5.860e-03"}  # worst over seeds
    assert "gdn-op" not in got["Profile traces"] and got["Profile traces"].count("- CP4") == 2


def test_conclusions_are_computed_with_their_rules() -> None:
    text = sections(markdown(campaign()))["Conclusions"]
    assert (
        "Single-device GDN: worst relative-L2 5.860e-03 (dq, triton T=16K, bound 0.01); every value within "
        "its metric's bound; it does not grow with T" in text
    )
    assert "does not grow with T" in text and "more than 2×" in text
    assert "Single-device speed-up triton vs eager (median fwd+bwd): 12.65× (8K) to 22.37× (16K)." in text
    assert "P2P gain over Ulysses 14.4% (16K) to 17.0% (64K); P2P faster at every shape." in text
    assert "output 1.00–1.00; input grad 1.00–1.00; param grads 1.00–1.00 — the same size" in text
    assert "Weak scaling CP4 → CP8 at local 16K" in text and "P2P scales better than Ulysses" in text
    assert "Every bound holds; no case errored." in text

    jobs = campaign()
    bad = jobs[2].data.cases[0]
    bad.metrics["output_rel_l2"] = metric("output_rel_l2", [0.02], "ratio", "accuracy", 1e-2)
    jobs[2].data.cases.append(
        case(
            "p2p_triton_T32768_B1",
            cp_params("p2p", 32768),
            status="error",
            error="Traceback ...\nRuntimeError: NCCL timeout",
        )
    )
    text = sections(markdown(jobs))["Conclusions"]
    assert (
        "CP layer: worst relative-L2 0.02 (output, triton T=64K, bound 0.01); 1 value(s) beyond their bound, "
        "the furthest 0.02 > 0.01 (output, triton T=64K): FAILS" in text
    )
    assert "- 2 case(s) failed a bound or errored:\n" in text
    assert f"- Failed: cp-layer #3 {bad.name}: out of bound (output_rel_l2).\n" in text
    assert "cp-layer #3 p2p_triton_T32768_B1: error (RuntimeError: NCCL timeout)" in text


def test_own_backends_against_the_peers_timed_beside_them() -> None:
    """Each own backend (distribution gdnval) against each peer of the same job and shape: the
    peer's median / ours for fwd+bwd and fwd, the peer's peak / ours; the baseline is no peer."""
    gdn = gdn_job()
    for T, (fwd, fb, mib) in {8192: (4.0, 12.5, 121.0), 16384: (9.0, 16.0, 250.0)}.items():
        p = {**next(c.params for c in gdn.data.cases if c.params["seq_len"] == T), "backend": "fla"}
        gdn.data.cases.append(case(f"T{T}_stateful_fla", p, *timed(fwd, fb), memory("peak_bytes", mib)))
    text = sections(markdown([gdn]))["Conclusions"]
    # triton at 8K: fwd 10/3 ms, fwd+bwd 10 ms, 100 MiB; at 16K: 20/3, 20 ms, 100 MiB
    assert (
        "- Single-device triton against fla (fla's median / triton's; above 1× triton is faster or smaller): "
        "fwd+bwd 1.25× (8K), 0.80× (16K); fwd 1.20× (8K), 1.35× (16K); incremental peak 1.21× (8K), "
        "2.50× (16K).\n" in text
    )
    assert "against eager" not in text and "fla against" not in text


def test_links_only_from_the_public_base_url() -> None:
    with_base = markdown(campaign())
    targets = re.findall(r"\]\(([^)]*)\)", with_base)
    assert targets and all(t.startswith(BASE + "/") for t in targets)
    assert f"({BASE}/api/v1/jobs/8/artifacts/rank0/trace-p2p.trace.json.gz)" in with_base
    for base in (None, "http://127.0.0.1:8000", "http://localhost:8000/"):
        md = render(build_sections(campaign(), (), public_links(base)), "campaign")
        assert "](" not in md and "127.0.0.1" not in md and "localhost" not in md, base
        assert "rank0/trace-p2p.trace.json.gz" in md  # the trace named, without a link


def test_public_links_read_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.settings import Settings

    monkeypatch.setenv("GDNVAL_PUBLIC_URL", "https://results.example.org/gdnval/")
    assert public_links(None) == Links("https://results.example.org/gdnval")
    assert public_links("https://other.example.org") == Links("https://other.example.org")
    monkeypatch.delenv("GDNVAL_PUBLIC_URL")
    assert public_links(None) == Links(None)
    with pytest.raises(ValueError, match="loopback host"):
        Settings(public_url="http://127.0.0.1:8000")


def test_a_column_without_values_is_left_out_the_first_always_stays() -> None:
    t = Table(["T", "gain", "fwd", "note"], [["8K", "–", "1.0", ""], ["16K", " – ", "2.0", "x"]])
    assert t.without_empty_columns() == Table(["T", "fwd", "note"], [["8K", "1.0", ""], ["16K", "2.0", "x"]])
    assert Table(["T"], [["–"]]).without_empty_columns() == Table(["T"], [["–"]])


def test_untracked_memory_is_not_zero_and_absent_sections_are_left_out() -> None:
    md = markdown([j for j in campaign("cpu") if j.data.suite in ("cp-layer", "gdn-op")])
    got = sections(md)
    assert list(got) == [
        "Environment and backends",
        "Single-device GDN accuracy",
        "Single-device GDN speed and memory",
        "CP layer accuracy",
        "CP layer speed and memory",
        "CP weak scaling",
        "Conclusions",
    ]
    assert "0.0 MiB" not in md
    _, rows = table(got["CP layer speed and memory"])
    assert {r["peak allocated"] for r in rows} == {r["peak reserved"] for r in rows} == {"not tracked"}
    header, rows = table(got["Single-device GDN speed and memory"])
    assert {r["incr. peak"] for r in rows} == {"not tracked"}
    # a column no row has a value in is left out (no peak ratio where no peak is tracked)
    assert "peak vs eager" not in header and "speed-up vs eager" in header
    assert render(build_sections([], (), Links(BASE)), "empty").strip() == "# empty"


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
        "Conclusions",
    ]
    assert "_No" not in md and "127.0.0.1" not in md
    # CP layer, H200 job: each row's numbers are its case's stored statistics
    h200, checked = stored[ids[0]], 0
    for (job_id, fingerprint), r in linked_rows(got["CP layer speed and memory"]):
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
        if r["mode"] == "p2p":
            u = h200[c.name.replace("p2p", "ulysses")].metrics["fwd_bwd_ms"].median
            assert r["gain vs Ulysses"] == f"{(u - fb.median) / u:.1%}", c.name
        checked += 1
    assert checked == len(h200) == 8
    _, rows = table(got["CP layer speed and memory"])
    # the CPU job's memory is not tracked, its rows still timed
    cpu_rows = [r for r in rows if r["peak allocated"] == "not tracked"]
    assert cpu_rows and all(r["peak reserved"] == "not tracked" and r["fwd"] != "–" for r in cpu_rows)
    # trajectories: the reference's range and the mean relative error per step, as stored
    _, rows = table(got["Network trajectories"])
    row = next(r for r in rows if r["mode"] == "ulysses, ckpt off")
    traj = stored[ids[2]]["traj/ulysses/ckpt-off"].metrics
    assert row["loss ref range"] == f"[{_fmt(traj['ref_loss'].min)}, {_fmt(traj['ref_loss'].max)}]"
    assert row["loss mean rel"] == _fmt(traj["bf16_loss_rel_err"].mean)
    assert row["grad-norm max rel"] == _fmt(traj["bf16_grad_norm_max_rel"].max)
    assert row["steps"] == str(traj["ref_loss"].count) == "200"
    # stability and the network's gain
    _, rows = table(got["Stability"])
    assert [r["passes"] for r in rows] == ["20", "20"] and all(
        r["memory growth"].endswith("MiB") for r in rows
    )
    _, rows = table(got["Network speed and memory"])
    net = stored[ids[1]]
    u, p = (net[f"speed/{m}/ckpt-off"].metrics["fwd_bwd_ms"].median for m in ("ulysses", "p2p"))
    assert next(r for r in rows if r["mode"] == "p2p")["gain vs Ulysses"] == f"{(u - p) / u:.1%}"
    assert f"Network CP2, 4 layers: P2P gain over Ulysses {(u - p) / u:.1%} (32K)" in got["Conclusions"]


def linked_rows(text: str) -> list[tuple[tuple[int, str], dict[str, str]]]:
    """((job id, case fingerprint) its row links to, the row) for each row of a section's table."""
    _, rows = table(text)
    raw = [ln for ln in text.splitlines() if ln.startswith("| ")][1:]
    out = []
    for ln, row in zip(raw, rows, strict=True):
        found = re.search(r"/jobs/(\d+)#case-([0-9a-f]+)\)", ln)
        assert found, ln
        out.append(((int(found.group(1)), found.group(2)), row))
    return out


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
    for key in ("environment", "cp-accuracy", "cp-speed", "trajectories", "network-speed", "stability"):
        assert f'id="report-{key}"' in html, key
    assert 'data-plot="cp-time"' in html
    # reference and candidate per step, loss and grad-norm, for each of the stored trajectory cases
    assert html.count('data-plot="trajectory"') == 2 * 2 and "ckpt-off: loss per step" in html
    assert "<th>gain vs Ulysses</th>" in html and re.search(r"<td>-?\d+\.\d%</td>", html)
    assert f'href="http://testserver/jobs/{ids[0]}#case-' in html
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
    assert list(got)[-2:] == ["Against the base campaign", "Conclusions"]
    header, rows = table(got["Against the base campaign"])
    assert header == ["suite", "head job", "base job", "verdict", "cases"]
    assert [(r["suite"], r["head job"], r["base job"], r["verdict"]) for r in rows] == [
        ("cp-layer", f"#{head[0]}", f"#{base[0]}", "FAIL"),  # its input grads fail their bound on both sides
        ("stability", f"#{head[1]}", f"#{base[1]}", "pass"),
    ]
    assert "](" not in md  # no public URL configured: no links

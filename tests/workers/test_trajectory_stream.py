"""Streamed trajectory samples and the reference trajectory file (tiny model, CPU, gloo).

- a candidate that hits a NaN at step k: the reference steps and the candidate steps < k reach
  the runtime's channel before the case ends with NonFiniteTrajectory; each step's samples are
  yielded before the next step starts;
- a completed streamed run gives exactly the samples (and summary) of the former
  collect-then-yield code, with errors computed directly from independent runs;
- reference file: written by the first run (also when the candidate later fails), read by the
  second (the reference is not recomputed, the samples are identical), a mismatching key names
  the differing field, a file of fewer steps is an error, a shorter run reads a prefix, a broken
  file is an error and is left alone; on 2 gloo ranks rank 0 reads/writes it and rank 1 gets
  the same steps (and the same error) through the broadcast;
- the sample buffer sends a waiting sample without another sample following.
"""

from __future__ import annotations

import io
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import workers.harness.trajectory as traj
from tests.support.dist_harness import run_distributed
from workers.context import RankContext
from workers.harness.trajectory import (
    ReferenceFileMismatch,
    Trainer,
    TrajectoryComparison,
    TrajectoryConfig,
    iter_trajectory,
    run_reference,
    run_steps,
)
from workers.registry import get_suite
from workers.suite import Case, Sample

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS = 4
SEQ = 32
CPU = torch.device("cpu")




@pytest.fixture(autouse=True)
def _empty_reference_cache() -> Iterator[None]:
    traj._REFERENCE_CACHE.clear()
    yield
    traj._REFERENCE_CACHE.clear()


def _case(token_file: Path, **over: Any) -> Case:
    suite = get_suite("network")
    params = suite.resolve_params("quick", {
        "modes": ["none"], "checkpoints": ["off"], "speed": False, "determinism": False,
        "steps": STEPS, "seq_len": SEQ, "batch_size": 1, "valid_lengths": None,
        "token_file": str(token_file), **over,
    })
    (case,) = suite.cases(params)
    assert "reference_file" not in case.params  # never part of a case's fingerprint
    return case


def _ctx(reference_file: Path | None = None) -> RankContext:
    extras = {"params": {"reference_file": str(reference_file) if reference_file else None}}
    return RankContext(rank=0, world_size=1, device=CPU, device_kind="cpu", extras=extras)


def _cfg(**over: Any) -> TrajectoryConfig:
    return TrajectoryConfig(**{"cp_mode": "none", "steps": STEPS, "seq_len": SEQ, "batch_size": 1, **over})


def _by_metric(samples: list[Sample]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for s in samples:
        assert s.idx not in out.get(s.metric, {}), f"{s.metric}[{s.idx}] twice"
        out.setdefault(s.metric, {})[s.idx] = s.value
    return out


def _nan_at_candidate_step(monkeypatch: pytest.MonkeyPatch, k: int, log: list[Any]) -> None:
    """A NaN weight just before candidate step k: the real finite check stops the run."""
    original = Trainer.step

    def step(self: Trainer, s: int, side: str):  # -> StepRecord
        log.append(("step", side, s))
        if side == "candidate" and s == k:
            with torch.no_grad():
                next(self.model.parameters()).fill_(math.nan)
        return original(self, s, side)

    monkeypatch.setattr(Trainer, "step", step)


def test_candidate_nan_keeps_reference_and_earlier_steps(
    token_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the runtime: the samples before the failure reach the channel, the case errors."""
    from workers.runtime import Channel, SampleBuffer, run_case

    k = 2
    log: list[Any] = []
    _nan_at_candidate_step(monkeypatch, k, log)
    suite, case = get_suite("network"), _case(token_file)
    ref_file = tmp_path / "ref.json"
    stream = io.StringIO()
    buffer = SampleBuffer(Channel(stream, rank=0))

    class Spy:  # what the suite yielded, interleaved with the training steps
        def run(self, ctx: RankContext, c: Case) -> Iterator[Sample]:
            for s in suite.run(ctx, c):
                log.append(("sample", s.metric, s.idx))
                yield s

        def metric(self, name: str) -> Any:
            return suite.metric(name)

    outcome = run_case(Spy(), _ctx(ref_file), case, buffer)  # type: ignore[arg-type]
    buffer.close()
    assert outcome.status == "error" and outcome.raised
    assert f"NonFiniteTrajectory: candidate step {k}: loss=nan" in (outcome.error or "")

    rows = [r for line in stream.getvalue().splitlines() for r in json.loads(line)["samples"]]
    got = _by_metric([Sample(*row) for row in rows])
    assert sorted(got["ref_loss"]) == sorted(got["ref_grad_norm"]) == list(range(STEPS))
    for metric in ("cand_loss", "cand_grad_norm", "fp32_loss_abs_err", "fp32_loss_rel_err",
                   "fp32_grad_norm_abs_err", "fp32_grad_norm_rel_err"):
        assert sorted(got[metric]) == list(range(k)), metric
    assert not {"fp32_loss_max_rel", "fp32_loss_max_abs", "finite"} & got.keys()
    # the same path on both sides: the steps before the NaN agree exactly
    assert all(got["cand_loss"][i] == got["ref_loss"][i] for i in range(k))

    # streamed: every reference sample before the candidate's first step, and each candidate
    # step's samples before the next step starts
    first_cand = log.index(("step", "candidate", 0))
    assert {e[1] for e in log[:first_cand] if e[0] == "sample"} == {"ref_loss", "ref_grad_norm"}
    for i in range(k):
        nxt = log.index(("step", "candidate", i + 1))
        assert ("sample", "fp32_grad_norm_rel_err", i) in log[:nxt]

    # the reference file was written when the reference finished, before the candidate failed
    doc = json.loads(ref_file.read_text())
    assert doc["steps"] == STEPS
    assert [r[0] for r in doc["records"]] == [got["ref_loss"][i] for i in range(STEPS)]


def _old_samples(name: str, cmp: TrajectoryComparison, prec: str) -> list[Sample]:
    """The former run_trajectory_case's samples (collect both sides, then yield), for comparison."""
    out: list[Sample] = []
    for i, (ref, cand) in enumerate(zip(cmp.reference, cmp.candidate, strict=True)):
        out += [Sample(name, "ref_loss", ref.loss, idx=i), Sample(name, "cand_loss", cand.loss, idx=i),
                Sample(name, "ref_grad_norm", ref.grad_norm, idx=i),
                Sample(name, "cand_grad_norm", cand.grad_norm, idx=i)]
    for what in ("loss", "grad_norm"):
        abs_err, rel_err = cmp.errors(what)
        for i, (a, b) in enumerate(zip(abs_err, rel_err, strict=True)):
            out += [Sample(name, f"{prec}_{what}_abs_err", a, idx=i),
                    Sample(name, f"{prec}_{what}_rel_err", b, idx=i)]
        out += [Sample(name, f"{prec}_{what}_max_abs", max(abs_err)),
                Sample(name, f"{prec}_{what}_max_rel", max(rel_err))]
    return [*out, Sample(name, "finite", 1.0)]


def test_completed_stream_equals_the_collected_run(token_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from service.cli.run import summarise

    build = traj.candidate_trainer

    def faster_candidate(*args: Any, **kwargs: Any) -> Trainer:  # a candidate that really differs
        trainer = build(*args, **kwargs)
        for group in trainer.optimizer.param_groups:
            group["lr"] *= 1.5
        return trainer

    monkeypatch.setattr(traj, "candidate_trainer", faster_candidate)
    suite, case = get_suite("network"), _case(token_file)
    streamed = list(suite.run(_ctx(), case))

    cfg = _cfg(valid_lengths=None, lr=1e-3)
    direct = TrajectoryComparison(
        run_reference(cfg, token_file, CPU, cache=False),
        run_steps(faster_candidate(cfg, token_file, CPU, None), STEPS, "candidate"),
    )
    old = _old_samples(case.name, direct, "fp32")
    assert direct.max_rel("loss") > 0 and direct.max_rel("grad_norm") > 0  # not a trivial comparison

    def key(s: Sample) -> tuple[str, int]:
        return (s.metric, s.idx)

    assert sorted(streamed, key=key) == sorted(old, key=key)  # the same samples, value for value
    def rows(samples: list[Sample]) -> list[dict[str, Any]]:
        return sorted(summarise(suite, samples), key=lambda r: (r["case"], r["metric"]))

    assert rows(streamed) == rows(old)
    got = _by_metric(streamed)
    abs_err, rel_err = direct.errors("grad_norm")
    assert [got["fp32_grad_norm_rel_err"][i] for i in range(STEPS)] == rel_err
    assert got["fp32_grad_norm_max_abs"][0] == max(abs_err) and got["finite"] == {0: 1.0}


def test_reference_file_written_then_read(
    token_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    suite, case = get_suite("network"), _case(token_file)
    ref_file = tmp_path / "refs" / "ref.json"
    built: list[int] = []
    build = traj.reference_trainer

    def counting(*args: Any, **kwargs: Any) -> Trainer:
        built.append(1)
        return build(*args, **kwargs)

    monkeypatch.setattr(traj, "reference_trainer", counting)
    first = list(suite.run(_ctx(ref_file), case))
    assert built == [1] and ref_file.exists()
    assert [p.name for p in ref_file.parent.iterdir()] == ["ref.json"]  # no temporary file left
    text = ref_file.read_text()
    doc = json.loads(text)
    assert (doc["format"], doc["version"], doc["steps"]) == ("gdnval-reference-trajectory", 1, STEPS)
    assert str(tmp_path) not in text and str(token_file.parent) not in text  # portable: no paths
    assert doc["key"]["device_kind"] == "cpu" and doc["key"]["data"]["size"] == token_file.stat().st_size

    traj._REFERENCE_CACHE.clear()
    events = list(iter_trajectory(_cfg(), token_file, CPU, reference_file=ref_file))
    assert {e.source for e in events} == {"file"} and built == [1]  # read, not recomputed
    second = list(suite.run(_ctx(ref_file), case))
    assert built == [1] and second == first  # identical samples, same order

    # fewer steps read a prefix of the file; more steps are an error naming both counts
    short = list(iter_trajectory(_cfg(steps=2), token_file, CPU, reference_file=ref_file))
    assert [e.reference for e in short if e.side == "reference"] == [e.reference for e in events][:2]
    more = rf"holds {STEPS} step\(s\), this run asks for {STEPS + 2}"
    with pytest.raises(ReferenceFileMismatch, match=more):
        next(iter_trajectory(_cfg(steps=STEPS + 2), token_file, CPU, reference_file=ref_file))
    assert built == [1]


def test_reference_file_mismatch_and_broken_file(token_file: Path, tmp_path: Path) -> None:
    ref_file = tmp_path / "ref.json"
    run_reference(_cfg(steps=2), token_file, CPU, reference_file=ref_file)
    seq = r"differing field\(s\): config\.seq_len: file 32, this run 64"
    with pytest.raises(ReferenceFileMismatch, match=seq):
        next(iter_trajectory(_cfg(steps=2, seq_len=64), token_file, CPU, reference_file=ref_file))
    with pytest.raises(ReferenceFileMismatch, match=r"config\.dtype: file 'float32', this run 'bfloat16'"):
        next(iter_trajectory(_cfg(steps=2, dtype="bfloat16"), token_file, CPU, reference_file=ref_file))
    other_tokens = tmp_path / "other.bin"
    other_tokens.write_bytes(token_file.read_bytes()[: token_file.stat().st_size // 2])
    with pytest.raises(ReferenceFileMismatch, match=r"data\.sha256: .*data\.size: "):
        next(iter_trajectory(_cfg(steps=2), other_tokens, CPU, reference_file=ref_file))
    # the candidate's side is not part of the key: another backend/CP mode reads the same file
    assert len(run_reference(_cfg(steps=2, checkpoint="full"), token_file, CPU, reference_file=ref_file)) == 2

    broken = tmp_path / "broken.json"
    text = ref_file.read_text()
    broken.write_text(text[: len(text) // 2])
    with pytest.raises(ReferenceFileMismatch, match=r"cannot be read as JSON"):
        next(iter_trajectory(_cfg(steps=2), token_file, CPU, reference_file=broken))
    assert broken.read_text() == text[: len(text) // 2]  # left alone, not overwritten


def _two_ranks(rank: int, world: int, tokens: str, ref_file: str) -> dict[str, Any]:
    cfg = TrajectoryConfig(cp_mode="p2p", steps=2, seq_len=SEQ, batch_size=1)
    out: dict[str, Any] = {}
    for run in ("first", "second"):
        out[run] = [(e.side, e.step, e.source, e.reference, e.candidate)
                    for e in iter_trajectory(cfg, tokens, CPU, reference_file=ref_file)]
    try:
        list(iter_trajectory(TrajectoryConfig(cp_mode="p2p", steps=3, seq_len=SEQ, batch_size=1),
                             tokens, CPU, reference_file=ref_file))
    except ReferenceFileMismatch as exc:
        out["error"] = str(exc)
    return out


@pytest.mark.slow  # two gloo processes
def test_reference_file_on_two_ranks(token_file: Path, tmp_path: Path) -> None:
    ref_file = tmp_path / "ref.json"
    r0, r1 = run_distributed(_two_ranks, 2, args=(str(token_file), str(ref_file)), timeout_s=120)
    assert r0 == r1  # rank 1 yields rank 0's reference steps, the global candidate numbers
    assert [e[2] for e in r0["first"]] == ["computed"] * 4 and [e[2] for e in r0["second"]] == ["file"] * 4
    order = [("reference", 0), ("reference", 1), ("candidate", 0), ("candidate", 1)]
    assert [e[:2] for e in r0["first"]] == order
    assert r0["first"] == [(e[0], e[1], "computed", *e[3:]) for e in r0["second"]]
    assert "holds 2 step(s), this run asks for 3" in r0["error"] and r1["error"] == r0["error"]


def test_sample_buffer_sends_a_waiting_sample() -> None:
    from workers.runtime import Channel, SampleBuffer

    stream = io.StringIO()
    buffer = SampleBuffer(Channel(stream, rank=0), flush_s=0.05)
    buffer.add(Sample("c", "m", 1.0))
    buffer.add(Sample("c", "m", 2.0, idx=1))  # within flush_s of the first: waits in the buffer
    deadline = time.monotonic() + 5
    while not stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.02)
    sent_alone = stream.getvalue()  # before close(), which would send it anyway
    buffer.close()
    assert sent_alone == stream.getvalue()
    rows = [r for line in stream.getvalue().splitlines() for r in json.loads(line)["samples"]]
    assert rows == [["c", "m", 1.0, 0, 0], ["c", "m", 2.0, 0, 1]]

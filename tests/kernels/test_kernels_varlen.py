"""Packed sequences (`cu_seqlens`) through the Triton kernels, one launch chain for all of them
(CPU interpreter): against the per-sequence fp64 oracle with lengths 1, 63, 64, 65 and 2, so
boundaries fall inside chunks, on them and next to them, every sequence with its own initial and
final state and every gradient, h0's included; against the dense kernels run on each sequence
alone (the same numbers, bit for bit); in fp16; the offsets' rule (`kernels.offsets`)."""

from __future__ import annotations

import importlib
import pkgutil
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import pairwise

import pytest
import torch

from gdn import recurrent_gated_delta_rule
from gdn.ops import triton_interpreter_on
from tests.support.gdn_inputs import make_inputs, rel_l2
from tests.support.program_order import programs_in_reverse_order

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or not triton_interpreter_on(),
    reason="interpreter tests run on machines without a GPU (TRITON_INTERPRET=1)",
)

LENGTHS = [1, 63, 64, 65, 2]
HQ, HV, D = 1, 2, 128
NAMES = ("q", "k", "v", "g", "beta", "h0")

Run = tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]


def _problem(lengths: list[int], seed: int) -> dict:
    total, n = sum(lengths), len(lengths)
    x = make_inputs(1, total, HQ, HV, D, dtype=torch.float64, stateful=False, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    leaves = {n_: getattr(x, n_).detach() for n_ in NAMES[:5]}
    leaves["h0"] = torch.randn(n, HV, D, D, generator=gen, dtype=torch.float64) * 0.1
    return {
        "leaves": leaves,
        "cu": torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()]),
        "do": torch.randn(1, total, HV, D, generator=gen, dtype=torch.float64),
        "dht": torch.randn(n, HV, D, D, generator=gen, dtype=torch.float64),
    }


def _run(p: dict, fn: Callable, dtype: torch.dtype) -> Run:
    """o, the final states and every input's gradient of fn(leaves) in `dtype` (g and h0 in fp32
    unless `dtype` is fp64, the oracle's)."""
    def cast(n: str) -> torch.dtype:
        return torch.float32 if n in ("g", "h0") and dtype != torch.float64 else dtype

    mine = {n: t.to(cast(n), copy=True).requires_grad_() for n, t in p["leaves"].items()}
    o, ht = fn(mine)
    torch.autograd.backward([o, ht], [p["do"].to(o.dtype), p["dht"].float()])
    return o.detach(), ht.detach(), {n: t.grad for n, t in mine.items()}


def _packed(p: dict) -> Callable:
    from kernels.gdn import gated_delta_rule_triton_varlen

    def fn(x: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return gated_delta_rule_triton_varlen(*(x[n] for n in NAMES[:5]), cu_seqlens=p["cu"],
                                              initial_state=x["h0"], output_final_state=True)

    return fn


def _each_alone(p: dict, core: Callable) -> Callable:
    """core(q, k, v, g, beta, initial_state=..., output_final_state=True) on every sequence's
    slice, concatenated."""

    def fn(x: dict) -> tuple[torch.Tensor, torch.Tensor]:
        outs, finals = [], []
        for i, (a, b) in enumerate(pairwise(p["cu"].tolist())):
            h0 = x["h0"][i : i + 1]
            o, ht = core(*(x[n][:, a:b] for n in NAMES[:5]), initial_state=h0, output_final_state=True)
            outs.append(o)
            finals.append(ht)
        return torch.cat(outs, 1), torch.cat(finals, 0)

    return fn


def per_sequence_reference(*args: torch.Tensor, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The dense Triton path on one sequence (what varlen ran before: one chain per sequence)."""
    from kernels.gdn import gated_delta_rule_triton

    return gated_delta_rule_triton(*args, **kwargs)


@contextmanager
def counted_launches() -> Iterator[Counter]:
    """Counts every stage kernel's launches while the block runs (each still runs)."""
    import kernels.gdn as pkg

    counts: Counter = Counter()

    class Counting:
        def __init__(self, fn) -> None:
            self.fn = fn

        def __getitem__(self, grid):
            counts[getattr(self.fn, "__name__", repr(self.fn))] += 1
            return self.fn[grid]

    mods = [importlib.import_module(f"kernels.gdn.{m.name}") for m in pkgutil.iter_modules(pkg.__path__)]
    patched = [(m, n) for m in mods for n in vars(m) if n.endswith("_kernel") and n.startswith("_")]
    assert len(patched) >= 11, f"kernels found: {patched}"
    for m, n in patched:
        setattr(m, n, Counting(getattr(m, n)))
    try:
        yield counts
    finally:
        for m, n in patched:
            setattr(m, n, getattr(m, n).fn)


def _oracle(p: dict) -> Run:
    return _run(p, _each_alone(p, recurrent_gated_delta_rule), torch.float64)


@pytest.mark.slow  # the fast tier's check of packing is gdn/test_varlen.py
def test_packed_sequences_match_each_sequence_alone_in_one_launch_chain() -> None:
    p = _problem(LENGTHS, seed=21)
    with counted_launches() as counts:
        o, ht, grads = _run(p, _packed(p), torch.float32)
    # the launches of one dense sequence for the five: one per stage, bwd_dqk's and bwd_wy's one
    # per value head of a q/k head's group
    per_head = {"_bwd_dqk_kernel", "_bwd_wy_kernel"}
    assert counts and all(n == (HV // HQ if k in per_head else 1) for k, n in counts.items()), \
        f"launches: {dict(counts)}"
    assert "_state_fwd_kernel" in counts and "_state_bwd_kernel" in counts
    o_ref, ht_ref, g_ref = _oracle(p)
    assert o.shape == (1, sum(LENGTHS), HV, D) and ht.shape == (len(LENGTHS), HV, D, D)
    assert rel_l2(o, o_ref) <= 2e-5 and rel_l2(ht, ht_ref) <= 2e-5
    for name in NAMES:
        err = rel_l2(grads[name], g_ref[name])
        assert err <= 2e-5, f"d{name}: {err:.2e}"

    # The dense kernels on each sequence alone give the same bits: a packed chunk is that
    # sequence's chunk, read in place, its end masked where the dense path masks at T.
    o_1, ht_1, g_1 = _run(p, _each_alone(p, per_sequence_reference), torch.float32)
    assert torch.equal(o, o_1) and torch.equal(ht, ht_1)
    for name in NAMES:
        assert torch.equal(grads[name], g_1[name]), f"d{name} differs from the dense path's"


def test_packed_walks_that_form_u_and_the_local_dvn_give_the_same_bits() -> None:
    """Packed sequences with the walks forming U and the intra-chunk dVn in their steps
    (`walk_vn` "u", `dvl_in_walk`; one walk per sequence through the chunk table): in fp32 the same
    bits as the default path's, which stores both."""
    from kernels.gdn import config_overrides

    p = _problem([65, 1, 64], seed=3)
    o, ht, grads = _run(p, _packed(p), torch.float32)
    with config_overrides(walk_vn="u", dvl_in_walk=True):
        o_w, ht_w, grads_w = _run(p, _packed(p), torch.float32)
    assert torch.equal(o, o_w) and torch.equal(ht, ht_w)
    for name in NAMES:
        assert torch.equal(grads[name], grads_w[name]), f"d{name} differs from the default path's"


def test_packed_launches_do_not_depend_on_the_order_of_their_programs() -> None:
    """Packed sequences written over in the backward (`bwd_in_place`; fp16, so the dk partial
    takes dS' slots at one key slice): every launch with its programs run last to first gives the
    bits of grid order (tests/support/program_order.py)."""
    from kernels.gdn import config_overrides

    p = _problem([65, 1, 64], seed=5)
    with config_overrides(bwd_in_place=True):
        o, ht, grads = _run(p, _packed(p), torch.float16)
        with programs_in_reverse_order():
            o_r, ht_r, grads_r = _run(p, _packed(p), torch.float16)
    assert torch.equal(o, o_r) and torch.equal(ht, ht_r)
    for name in NAMES:
        assert torch.equal(grads[name], grads_r[name]), f"d{name} depends on the order of a launch's programs"


@pytest.mark.slow
def test_packed_fp16() -> None:
    """fp16 (WY products in fp16 through "low"): within fp16's rounding of the oracle (a
    chunk-misaligned sequence, then a lone token), and bit for bit the same forward without
    autograd."""
    p = _problem([65, 1], seed=5)
    o_ref, ht_ref, g_ref = _oracle(p)
    o, ht, grads = _run(p, _packed(p), torch.float16)
    with torch.no_grad():  # nothing kept for a backward: same numbers
        o_ng, ht_ng = _packed(p)({n: t.to(torch.float32 if n in ("g", "h0") else torch.float16)
                                  for n, t in p["leaves"].items()})
    errs = {"o": rel_l2(o, o_ref), "ht": rel_l2(ht, ht_ref)}
    errs |= {f"d{n}": rel_l2(grads[n], g_ref[n]) for n in NAMES}
    bad = {k: f"{v:.1e}" for k, v in errs.items() if not v <= 3e-3}
    assert not bad, f"over 3e-3: {bad} (all: {errs})"
    assert torch.equal(o_ng, o) and torch.equal(ht_ng, ht)


def test_chunk_table() -> None:
    """Which rows each chunk covers: every sequence's chunks from its own first row, the short last
    one ending at the sequence's end; no row is copied anywhere."""
    from kernels.gdn.chunks import ChunkTable

    tab = ChunkTable.of([0, 1, 64, 128, 193], torch.device("cpu"))
    assert tab.spans.dtype == tab.seq_chunks.dtype == torch.int32
    assert tab.spans.tolist() == [[0, 1], [1, 64], [64, 128], [128, 192], [192, 193]]
    assert tab.seq_chunks.tolist() == [0, 1, 2, 3, 5]
    dense = ChunkTable.of([0, 130], torch.device("cpu"))  # one sequence: the dense chunks
    assert dense.spans.tolist() == [[0, 64], [64, 128], [128, 130]]


def test_bad_offsets_are_refused() -> None:
    """By the rule `gdn.gated_delta_rule` applies for every backend (`kernels.offsets`): offsets
    that fall, an empty sequence, a wrong end, floats, a state per sequence, batch 1."""
    from kernels.gdn import gated_delta_rule_triton_varlen

    x = make_inputs(1, 8, HQ, HV, D, dtype=torch.float32, stateful=False, seed=1)
    args = (x.q, x.k, x.v, x.g, x.beta)
    with pytest.raises(ValueError, match=r"strictly increasing .* cu_seqlens\[1\]=5 then cu_seqlens\[2\]=3"):
        gated_delta_rule_triton_varlen(*args, cu_seqlens=torch.tensor([0, 5, 3, 8]))
    with pytest.raises(ValueError, match=r"cu_seqlens\[0\]=0 then cu_seqlens\[1\]=0"):
        gated_delta_rule_triton_varlen(*args, cu_seqlens=torch.tensor([0, 0, 8]))
    with pytest.raises(ValueError, match="must end at T=8, got 7"):
        gated_delta_rule_triton_varlen(*args, cu_seqlens=torch.tensor([0, 7]))
    with pytest.raises(ValueError, match="1-D integer"):
        gated_delta_rule_triton_varlen(*args, cu_seqlens=torch.tensor([0.0, 8.0]))
    with pytest.raises(ValueError, match="initial_state must be"):
        gated_delta_rule_triton_varlen(*args, cu_seqlens=torch.tensor([0, 8]),
                                       initial_state=torch.zeros(2, HV, D, D))
    with pytest.raises(ValueError, match="batch 1"):
        gated_delta_rule_triton_varlen(*(torch.cat([t, t]) for t in args), cu_seqlens=torch.tensor([0, 8]))

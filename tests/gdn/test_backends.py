"""The backend registry: names resolve to built-ins, entry points and `module:function`; an
unknown name fails naming the registered ones; capability checks refuse with their reason;
provenance names the distribution and version a backend comes from."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from gdn import GDNShape, UnsupportedGDNRequest, gated_delta_rule, get_backend, registered_backends
from gdn.backends import ENTRY_POINT_GROUP, FLA_FLASH_QLA_ENV, registry
from gdn.backends.builtin import pure_fla_reason
from tests.support.gdn_inputs import make_inputs, rel_l2
from workers.provenance import backend_provenance


def _x():
    return make_inputs(1, 70, 1, 2, 8, dtype=torch.float64, seed=2)


def test_unknown_backend_names_the_registered_ones() -> None:
    x = _x()
    with pytest.raises(UnsupportedGDNRequest, match=r"backend='nope' is not supported; registered backends: "
                       r"'eager', 'triton', 'fla', 'flashqla'"):
        gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, backend="nope")
    assert registered_backends()[:4] == ("eager", "triton", "fla", "flashqla")


def test_module_function_one_off_runs_that_function() -> None:
    x = _x()
    o, ht = gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
                             backend="gdn.reference:recurrent_gated_delta_rule")
    o_e, ht_e = gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True)
    assert rel_l2(o, o_e) < 1e-12 and rel_l2(ht, ht_e) < 1e-12
    with pytest.raises(UnsupportedGDNRequest, match=r"module 'gdn.nothing' does not import"):
        get_backend("gdn.nothing:f")
    with pytest.raises(UnsupportedGDNRequest, match=r"has no attribute 'nothing'"):
        get_backend("gdn.reference:nothing")
    with pytest.raises(UnsupportedGDNRequest, match=r"chunk_size=32 is not supported by backend"):
        gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, chunk_size=32,
                         backend="gdn.reference:recurrent_gated_delta_rule")


def test_peers_say_why_they_cannot_run_here(monkeypatch: pytest.MonkeyPatch) -> None:
    x = _x()
    for name, module in (("fla", "fla"), ("flashqla", "flash_qla")):
        reason = get_backend(name).unsupported(GDNShape.of(x.q, x.v), torch.float32, torch.device("cpu"))
        assert reason is not None
        assert f"module {module!r} is not importable" in reason or "needs CUDA" in reason
        with pytest.raises(UnsupportedGDNRequest, match=f"backend {name!r}"):
            gated_delta_rule(x.q.float(), x.k.float(), x.v.float(), x.g.float(), x.beta.float(), backend=name)
    monkeypatch.delenv(FLA_FLASH_QLA_ENV, raising=False)
    assert pure_fla_reason() is None and os.environ[FLA_FLASH_QLA_ENV] == "0"
    monkeypatch.setenv(FLA_FLASH_QLA_ENV, "1")
    assert "FLA_FLASH_QLA='1' lets FLA dispatch to FlashQLA" in (pure_fla_reason() or "")


PLUGIN = '''
import torch
from gdn.reference import recurrent_gated_delta_rule

def core(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """per-token recurrence in fp64"""
    return recurrent_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                      output_final_state=output_final_state, cu_seqlens=cu_seqlens)

def _check(shape, dtype, device):
    return None if shape.head_dim_k <= 16 else f"tiny backend: head_dim {shape.head_dim_k} > 16"

core.gdnval_check = _check
'''


def test_entry_point_backend_is_found_checked_and_traced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "tiny_gdn.py").write_text(PLUGIN)
    info = tmp_path / "tiny_gdn-0.3.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-gdn\nVersion: 0.3.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\ntiny = tiny_gdn:core\n")
    (info / "top_level.txt").write_text("tiny_gdn\n")
    (info / "RECORD").write_text("tiny_gdn.py,,\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_LOADED", {})
    assert "tiny" in registered_backends()
    x = _x()
    o, _ = gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, backend="tiny")
    assert rel_l2(o, gated_delta_rule(x.q, x.k, x.v, x.g, x.beta)[0]) < 1e-12
    big = make_inputs(1, 4, 1, 1, 32, dtype=torch.float64)
    with pytest.raises(UnsupportedGDNRequest, match=r"tiny backend: head_dim 32 > 16"):
        gated_delta_rule(big.q, big.k, big.v, big.g, big.beta, backend="tiny")
    prov = backend_provenance("tiny")
    assert (prov["distribution"], prov["version"]) == ("tiny-gdn", "0.3.1")
    tiny_bytes = prov["content_hash"]
    assert tiny_bytes is not None and tiny_bytes == backend_provenance("tiny")["content_hash"]
    assert backend_provenance("eager")["distribution"] == "gdnval"
    # a built-in is the job's code: the commit the job runs, not the importing tree's
    assert backend_provenance("eager", "c" * 40)["commit"] == "c" * 40
    assert backend_provenance("tiny", "c" * 40)["commit"] != "c" * 40  # another distribution's own
    assert "not supported" in (backend_provenance("missing")["error"] or "")
    sys.modules.pop("tiny_gdn", None)


def test_p2p_emulation_runs_over_a_named_backend() -> None:
    """P2P needs only a final state and its initial-state gradient: over a one-off backend (the
    per-token oracle by `module:function`) the emulated 3-shard chain equals that backend's own
    no-CP run in fp64, gradients too."""
    from gdn.cp.emulation import emulated_p2p_gated_delta_rule

    name = "gdn.reference:recurrent_gated_delta_rule"
    x = make_inputs(1, 51, 1, 2, 4, stateful=True, seed=9).requires_grad_()
    do, dht = torch.randn(1, 51, 2, 4, dtype=torch.float64), torch.randn(1, 2, 4, 4, dtype=torch.float64)
    o, ht = emulated_p2p_gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, num_shards=3, backend=name,
                                          initial_state=x.h0)
    got = torch.autograd.grad([o, ht], x.tensors(), [do, dht])
    o_ref, ht_ref = gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
                                     backend=name)
    want = torch.autograd.grad([o_ref, ht_ref], x.tensors(), [do, dht])
    assert rel_l2(o, o_ref) < 1e-12 and rel_l2(ht, ht_ref) < 1e-12
    assert all(rel_l2(a, b) < 1e-12 for a, b in zip(got, want, strict=True))


def test_suites_take_backends_by_name_and_refuse_malformed_ones() -> None:
    from workers.registry import get_suite

    cp = get_suite("cp-layer")
    cases = cp.cases(cp.resolve_params("quick", {"candidates": ["ulysses+mypkg.gdn:core", "p2p+extgdn"]}))
    assert {c.params["backend"] for c in cases} == {"mypkg.gdn:core", "extgdn"}
    op = get_suite("gdn-op")
    with pytest.raises(ValueError, match=r"bad backend name\(s\) \['no way'\]"):
        op.cases(op.resolve_params("quick", {"backends": ["eager", "no way"]}))
    with pytest.raises(ValueError, match=r"baseline 'fla' is not one of the backends \['eager'\]"):
        op.cases(op.resolve_params("quick", {"backends": ["eager"], "baseline": "fla"}))
    assert op.backends(op.resolve_params("full")) == ("eager", "triton", "fla")

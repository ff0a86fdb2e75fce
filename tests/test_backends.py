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
from tests.gdn_inputs import make_inputs, rel_l2
from workers.provenance import backend_provenance


def _x():
    return make_inputs(1, 70, 1, 2, 8, dtype=torch.float64, seed=2)


def test_unknown_backend_names_the_registered_ones() -> None:
    x = _x()
    with pytest.raises(UnsupportedGDNRequest, match=r"backend='nope' is not supported; registered backends: "
                       r"'eager', 'triton', 'fla', 'flashqla'"):  # fmt: skip
        gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, backend="nope")
    assert registered_backends()[:4] == ("eager", "triton", "fla", "flashqla")


def test_module_function_one_off_runs_that_function() -> None:
    x = _x()
    o, ht = gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, initial_state=x.h0, output_final_state=True,
                             backend="gdn.reference:recurrent_gated_delta_rule")  # fmt: skip
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
    assert backend_provenance("eager")["distribution"] == "gdnval"
    assert "not supported" in (backend_provenance("missing")["error"] or "")
    sys.modules.pop("tiny_gdn", None)

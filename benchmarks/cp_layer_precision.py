"""Where does the emulated-P2P layer differ from the plain layer, and which side is off?

For the report's layer (hidden 2048, heads 16/32, dim 128) under bf16 autocast with the Triton
core, at T = 8K/16K/32K, prints the relative L2 of output, input gradient and parameter
gradients for three pairs: plain vs truth, emulated P2P (P = 4, 8) vs truth, and emulated vs
plain (what tests/gdn/test_cp_gpu.py checks). "truth" is the same layer in fp32 without autocast on
the eager core, TF32 off. `--conv cudnn` swaps the layer's conv back to `F.conv1d` (cuDNN picks
its algorithm by length under autocast) to compare with the project's fp32 shifted-sum conv.

    python benchmarks/cp_layer_precision.py [--conv ours|cudnn|both] [--seq-lens 8192 16384 32768]
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gdn.cp.emulation import emulated_p2p_layer
from gdn.layer import GatedDeltaNet, GDNLayerConfig, gdn_layer_init_

SHOWN = ("output", "input_grad", "in_proj_qkv.weight", "conv1d.weight", "in_proj_a.weight", "params")


def _cudnn_conv(self: GatedDeltaNet, qkv: torch.Tensor, halo: torch.Tensor | None, channels=None):
    w = self.conv1d.weight if channels is None else self.conv1d.weight.index_select(0, channels)
    width = self.config.conv_size - 1
    if halo is None:
        halo = qkv.new_zeros(qkv.shape[0], width, qkv.shape[2])
    inp = torch.cat([halo, qkv], dim=1).transpose(1, 2)
    return F.silu(F.conv1d(inp, w, groups=w.shape[0]).transpose(1, 2))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def _grads(layer: GatedDeltaNet, fn, x: torch.Tensor, dy: torch.Tensor, autocast: bool) -> dict:
    params = dict(layer.named_parameters())
    dtype = torch.bfloat16 if x.is_cuda else torch.float16  # the CPU interpreter has no bf16 dot
    with torch.autocast(x.device.type, dtype=dtype, enabled=autocast):
        y = fn(x)
    gs = torch.autograd.grad(y, [x, *params.values()], dy.to(y.dtype))
    out = {"output": y.float(), "input_grad": gs[0].float()}
    out.update({n: g.float() for n, g in zip(params, gs[1:], strict=True)})
    out["params"] = torch.cat([g.float().flatten() for g in gs[1:]])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--conv", choices=("ours", "cudnn", "both"), default="both")
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[8192, 16384, 32768])
    ap.add_argument("--shards", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="hidden 256, heads 1/2, dim 128 (a CPU smoke run)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ours = GatedDeltaNet.conv
    dev = torch.device(args.device)
    for conv in ("ours", "cudnn") if args.conv == "both" else (args.conv,):
        for T in args.seq_lens:
            GatedDeltaNet.conv = ours  # the truth always uses the exact conv
            cfg = GDNLayerConfig(256, 1, 2, 128) if args.tiny else GDNLayerConfig()
            layer = gdn_layer_init_(GatedDeltaNet(cfg, backend="triton"), 0).to(dev)
            gen = torch.Generator(device=dev).manual_seed(T)
            x = torch.randn(1, T, cfg.hidden_size, device=dev, generator=gen).requires_grad_()
            dy = torch.randn(1, T, cfg.hidden_size, device=dev, generator=gen) / T**0.5
            layer.backend = "eager"
            truth = _grads(layer, layer, x, dy, autocast=False)
            layer.backend = "triton"
            GatedDeltaNet.conv = ours if conv == "ours" else _cudnn_conv
            plain = _grads(layer, layer, x, dy, autocast=True)
            rows = {"plain-truth": {n: _rel(plain[n], truth[n]) for n in SHOWN}}
            for P in args.shards:
                emu_fn = partial(emulated_p2p_layer, layer, num_shards=P)
                emu = _grads(layer, emu_fn, x, dy, autocast=True)
                rows[f"emu{P}-truth"] = {n: _rel(emu[n], truth[n]) for n in SHOWN}
                rows[f"emu{P}-plain"] = {n: _rel(emu[n], plain[n]) for n in SHOWN}
                del emu
            del truth, plain
            for pair, errs in rows.items():
                cells = " ".join(f"{n}={v:.2e}" for n, v in errs.items())
                print(f"conv={conv} T={T} {pair}: {cells}", flush=True)
    GatedDeltaNet.conv = ours


if __name__ == "__main__":
    main()

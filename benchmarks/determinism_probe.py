"""Where does a GPU run stop being bitwise reproducible? (the network suite's determinism pair)

Under deterministic mode, runs the same work twice (and with activation checkpoint) and names
what differs, smallest unit first: the Triton GDN core, the attention kernel, then one
fwd+bwd of the model per backend with checkpoint off, off again, and full. Prints one line per
comparison; exits 0 either way (it is a probe, the suite's determinism case is the check).

    python3 benchmarks/determinism_probe.py --seq-len 2048
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gdn import gated_delta_rule
from gdn.device import set_deterministic
from gdn.model import HybridModel, build_model
from gdn.parallel import apply_activation_checkpoint


def differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[tuple[str, float]]:
    out = []
    for name, x in a.items():
        y = b[name]
        if not torch.equal(x, y):
            out.append((name, float((x.double() - y.double()).abs().max())))
    return out


def report(what: str, diffs: list[tuple[str, float]], total: int) -> None:
    if not diffs:
        print(f"{what}: bit-identical ({total} tensors)", flush=True)
        return
    worst = max(d for _, d in diffs)
    # nearest the loss first: the unit that starts the difference is the last one listed here
    names = ", ".join(f"{n} ({d:.2e})" for n, d in reversed(diffs[-12:]))
    print(f"{what}: {len(diffs)}/{total} differ, max {worst:.3e}: {names}", flush=True)


def core_run(inputs: dict[str, torch.Tensor], do: torch.Tensor, dht: torch.Tensor) -> dict[str, torch.Tensor]:
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in inputs.items()}
    o, ht = gated_delta_rule(
        leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
        initial_state=leaves["h0"], output_final_state=True, backend="triton",
    )
    torch.autograd.backward([o, ht], [do, dht])
    out = {"o": o.detach(), "ht": ht.detach()}
    out.update({f"d{n}": t.grad for n, t in leaves.items()})
    return out


def probe_core(seq_len: int, dev: torch.device) -> None:
    gen = torch.Generator(device=dev).manual_seed(0)
    B, T, Hqk, Hv, D = 1, seq_len, 16, 32, 128

    def rand(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.randn(*shape, device=dev, generator=gen, dtype=torch.float32).to(dtype)

    inputs = {
        "q": F.normalize(rand(B, T, Hqk, D).float(), dim=-1).bfloat16(),
        "k": F.normalize(rand(B, T, Hqk, D).float(), dim=-1).bfloat16(),
        "v": rand(B, T, Hv, D),
        "g": F.logsigmoid(rand(B, T, Hv, dtype=torch.float32) + 2),
        "beta": torch.sigmoid(rand(B, T, Hv, dtype=torch.float32)).bfloat16(),
        "h0": rand(B, Hv, D, D, dtype=torch.float32),
    }
    do, dht = rand(B, T, Hv, D), rand(B, Hv, D, D, dtype=torch.float32)
    runs = [core_run(inputs, do, dht) for _ in range(3)]
    report(f"core triton T={T} 16/32 run1 vs run2", differing(runs[0], runs[1]), len(runs[0]))
    report(f"core triton T={T} 16/32 run1 vs run3", differing(runs[0], runs[2]), len(runs[0]))


def probe_attention(seq_len: int, dev: torch.device) -> None:
    from torch.nn.attention.bias import causal_lower_right

    gen = torch.Generator(device=dev).manual_seed(1)
    shape = (1, 16, seq_len, 256)
    base = [torch.randn(shape, device=dev, generator=gen).bfloat16() for _ in range(3)]
    do = torch.randn(shape, device=dev, generator=gen).bfloat16()
    runs = []
    for _ in range(2):
        q, k, v = (t.clone().requires_grad_(True) for t in base)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(seq_len, seq_len))
        o.backward(do)
        runs.append({"o": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad})
    report(f"sdpa causal_lower_right T={seq_len} run1 vs run2", differing(*runs), 4)


def model_grads(backend: str, checkpoint: str, seq_len: int, dev: torch.device) -> dict[str, torch.Tensor]:
    model = build_model("qwen35-4l", backend=backend, seed=0, device=dev)
    apply_activation_checkpoint(model, checkpoint)
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 256, (1, seq_len + 1), generator=gen).to(dev)
    with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
        logits = model(tokens[:, :-1], None)
    loss = HybridModel.loss(logits, tokens[:, 1:], seq_len)
    loss.backward()
    out = {"loss": loss.detach()}
    for name, p in model.named_parameters():
        out[name.replace("._checkpoint_wrapped_module", "")] = p.grad
    return out


def probe_model(seq_len: int, dev: torch.device, backends: list[str]) -> None:
    for backend in backends:
        off1 = model_grads(backend, "off", seq_len, dev)
        off2 = model_grads(backend, "off", seq_len, dev)
        full = model_grads(backend, "full", seq_len, dev)
        report(f"model {backend} T={seq_len} ckpt off vs off", differing(off1, off2), len(off1))
        report(f"model {backend} T={seq_len} ckpt off vs full", differing(off1, full), len(off1))
        del off1, off2, full
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--core-seq-len", type=int, default=8192)
    ap.add_argument("--backends", nargs="+", default=["triton", "eager"])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("determinism_probe needs a CUDA device")
    dev = torch.device("cuda")
    set_deterministic("cuda", True)
    probe_core(args.core_seq_len, dev)
    probe_attention(args.seq_len, dev)
    probe_model(args.seq_len, dev, args.backends)


if __name__ == "__main__":
    main()

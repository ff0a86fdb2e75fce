"""Collective sanity check before the several-GPU suites: one process per device, as the local
executor starts ranks (env:// rendezvous on 127.0.0.1, RANK/WORLD_SIZE/LOCAL_RANK).

Per rank: an all-reduce whose sum is checked, a send/recv ring whose payload is checked, on CUDA
whether `work.wait()` with and without a timeout blocks the host (`wait_*_host_ms`), then
all-reduces of `--mib` MiB for `--seconds` (bus bandwidth as nccl-tests counts it). Two layouts on
CUDA: `isolated` (each rank sees only its own GPU through CUDA_VISIBLE_DEVICES, exactly what the
executor does) and `shared` (every rank sees every GPU and picks its own). With `--nccl-debug` the
transport NCCL chose (P2P/CUMEM, SHM, ...) is printed from rank 0's NCCL log: a P2P ring in one
layout and SHM in the other means the executor's device isolation costs bandwidth.

NVLink multicast stays off (the same variables the rank runtime sets). Exit 0 when every check of
every layout passed.

    python3 benchmarks/nccl_check.py --nprocs 4 --seconds 2 --nccl-debug
    python3 benchmarks/nccl_check.py --device cpu --nprocs 2 --seconds 0.5      # gloo
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time

NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
TRANSPORT_WORDS = (" via ", "NVLS", "NCCL version", "P2P/", "SHM/", "comm 0x")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        index = 0 if args.layout == "isolated" else rank
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    else:
        device = torch.device("cpu")
    if args.device == "cuda":  # device_id: the communicator binds to this rank's GPU at once
        dist.init_process_group("nccl", init_method="env://", device_id=device)
    else:
        dist.init_process_group("gloo", init_method="env://")
    out: dict[str, object] = {"rank": rank, "layout": args.layout}
    try:
        x = torch.full((1024,), float(rank + 1), device=device)
        dist.all_reduce(x)
        out["allreduce_ok"] = bool((x == world * (world + 1) / 2).all().item())
        send = torch.full((1024,), float(rank), device=device)
        recv = torch.empty_like(send)
        ops = [
            dist.P2POp(dist.isend, send, (rank + 1) % world),
            dist.P2POp(dist.irecv, recv, (rank - 1) % world),
        ]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        out["ring_ok"] = bool((recv == float((rank - 1) % world)).all().item())
        if args.device == "cuda":
            out.update(_wait_blocking(torch, dist, device))
        buf = torch.zeros(int(args.mib * (1 << 20)) // 4, dtype=torch.float32, device=device)
        for _ in range(3):  # warm-up: communicator set-up, first-use allocations
            dist.all_reduce(buf)
        sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
        sync()
        dist.barrier()
        iters, t0 = 0, time.perf_counter()
        while True:
            for _ in range(5):
                dist.all_reduce(buf)
            iters += 5
            sync()
            flag = torch.tensor([time.perf_counter() - t0 >= args.seconds], dtype=torch.int32, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # every rank stops at the same iteration
            if flag.item():
                break
        elapsed = time.perf_counter() - t0
        nbytes = buf.numel() * 4
        out.update(
            iters=iters,
            ms_per_allreduce=round(elapsed / iters * 1e3, 4),
            busbw_gbs=round(2 * (world - 1) / world * nbytes * iters / elapsed / 1e9, 2),
            zeros_ok=bool((buf == 0).all().item()),
        )
    finally:
        dist.destroy_process_group()
    print("RESULT " + json.dumps(out), flush=True)


def _wait_blocking(torch, dist, device) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Host time of `work.wait()` and of `work.wait(timeout)` on an all-reduce queued behind
    ~0.1 s of GPU work: near 0 means the wait only orders streams, ~100 ms means it blocks the
    host until the collective is done (the CP layer waits with a timeout: gdn/cp/comm.py)."""
    from datetime import timedelta

    out = {}
    x = torch.ones(1024, device=device)
    for name, timeout in (("wait_host_ms", None), ("wait_timeout_host_ms", timedelta(seconds=60))):
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU clock cycles before the collective
        work = dist.all_reduce(x, async_op=True)
        t0 = time.perf_counter()
        work.wait() if timeout is None else work.wait(timeout)
        out[name] = round((time.perf_counter() - t0) * 1e3, 2)
        torch.cuda.synchronize()
    return out


def run_layout(args: argparse.Namespace, layout: str) -> bool:
    port = _free_port()
    procs = []
    for rank in range(args.nprocs):
        env = {**os.environ, **NVLS_OFF, "RANK": str(rank), "WORLD_SIZE": str(args.nprocs),
               "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        if args.device == "cuda" and layout == "isolated":
            parent = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
            env["CUDA_VISIBLE_DEVICES"] = parent[rank] if rank < len(parent) else str(rank)
        if args.nccl_debug and args.device == "cuda":
            env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,P2P,SHM,NET")
        cmd = [sys.executable, __file__, "--rank-main", "--layout", layout, "--device", args.device,
               "--seconds", str(args.seconds), "--mib", str(args.mib)]
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    ok = True
    results = []
    for rank, p in enumerate(procs):
        try:
            output, _ = p.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            output, _ = p.communicate()
            print(f"[{layout}] rank {rank} timed out after {args.timeout} s")
            ok = False
        lines = output.splitlines()
        got = [json.loads(line[7:]) for line in lines if line.startswith("RESULT ")]
        if p.returncode != 0 or not got:
            ok = False
            print(f"[{layout}] rank {rank} exited with {p.returncode}; last lines:")
            print("\n".join(lines[-15:]))
        results += got
        if rank == 0 and args.nccl_debug:
            seen: list[str] = []
            for line in lines:
                text = line.split("NCCL INFO", 1)[-1].strip()
                if any(w in line for w in TRANSPORT_WORDS) and text not in seen:
                    seen.append(text)
            for text in seen[:25]:
                print(f"[{layout}] rank 0 NCCL: {text}")
            found = sorted({m.group(1) for line in lines if (m := re.search(r" via (\S+)", line))})
            print(f"[{layout}] transports: {', '.join(found) or 'none logged'}")
    for r in sorted(results, key=lambda r: r["rank"]):
        good = r.get("allreduce_ok") and r.get("ring_ok") and r.get("zeros_ok")
        ok = ok and bool(good)
        print(f"[{layout}] {'ok  ' if good else 'FAIL'} " + json.dumps(r))
    if len(results) != args.nprocs:
        ok = False
    print(f"[{layout}] {args.nprocs} ranks: {'passed' if ok else 'FAILED'}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nprocs", type=int, default=0, help="ranks (default: every visible GPU)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--seconds", type=float, default=2.0, help="timed all-reduce loop per layout")
    ap.add_argument("--mib", type=float, default=256.0, help="all-reduce size (MiB, fp32)")
    ap.add_argument("--layouts", default="isolated,shared", help="cuda: isolated and/or shared")
    ap.add_argument("--timeout", type=float, default=120.0, help="per layout, seconds")
    ap.add_argument("--nccl-debug", action="store_true", help="print the transports NCCL chose")
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--layout", default="isolated", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.update(NVLS_OFF)
    if args.rank_main:
        rank_main(args)
        return 0
    if args.nprocs < 1:
        import torch

        args.nprocs = torch.cuda.device_count() if args.device == "cuda" else 2
    if args.nprocs < 2:
        print(f"need at least 2 ranks, got {args.nprocs}")
        return 2
    layouts = args.layouts.split(",") if args.device == "cuda" else ["isolated"]
    results = [run_layout(args, layout) for layout in layouts]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

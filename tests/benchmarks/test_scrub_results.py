"""benchmarks/scrub_results.py: what a device run returns loses its machine facts, keeps its numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.scrub_results import main, scrub_json


def _result() -> dict:
    return {
        "info": {
            "host": "box7", "pid": 11, "torch": "2.11", "ranks": [{"host": "box7", "pid": 12, "rank": 0}]
        },
        "params": {"reference_file": "/srv/ckout/.refs/traj.json"},
        "logs": [
            "[rank 0] /opt/env/lib/python3.12/site-packages/torch/autograd/graph.py:869: UserWarning",
            "GPU 0: NVIDIA H200 (UUID: GPU-0e3011de-7ff6-fd48-6a2c-e176167fd57c)",
            "json to /root/out/traj.json",
        ],
        "samples": [{"case": "c", "metric": "m", "rank": r, "value": 0.5 + r} for r in range(2)],
    }


def test_machine_facts_go_and_numbers_stay() -> None:
    out = scrub_json(_result(), ["/srv/ckout"])
    assert out["info"] == {"torch": "2.11", "ranks": [{"rank": 0}]}
    assert out["params"]["reference_file"] == ".refs/traj.json"
    assert out["logs"] == [
        "[rank 0] torch/autograd/graph.py:869: UserWarning",
        "GPU 0: NVIDIA H200 (UUID: GPU-<uuid>)",
        "json to $OUT/traj.json",
    ]
    assert [s["value"] for s in out["samples"]] == [0.5, 1.5]
    assert [s["rank"] for s in scrub_json(_result(), [], rank0=True)["samples"]] == [0]


def test_cli_refuses_to_leave_an_unknown_root(tmp_path: Path) -> None:
    src, dst = tmp_path / "in.json", tmp_path / "out.json"
    data = _result()
    data["params"]["reference_file"] = "/work/other/.refs/traj.json"
    src.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="absolute paths left"):
        main([str(src), str(dst), "--root", "/srv/ckout"])
    main([str(src), str(dst), "--root", "/work/other", "--rank0"])
    assert json.loads(dst.read_text())["params"]["reference_file"] == ".refs/traj.json"

"""Layering rules, checked in fresh interpreters: what each top-level import may load."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from click.testing import CliRunner

from service.cli import main
from workers.provenance import source_commit


def _run(code: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_gdn_loads_neither_triton_nor_kernels():
    loaded = _run(
        """
        import json, sys
        import gdn
        print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('triton', 'kernels'))))
        """
    )
    assert loaded == []


def test_eager_backend_works_with_triton_unimportable():
    result = _run(
        """
        import importlib.abc, json, sys

        class BlockTriton(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] == 'triton':
                    raise ImportError('triton is blocked in this test')
                return None

        sys.meta_path.insert(0, BlockTriton())
        import torch
        import gdn
        q = torch.randn(1, 70, 1, 8); k = torch.nn.functional.normalize(torch.randn(1, 70, 1, 8), dim=-1)
        v = torch.randn(1, 70, 2, 8); g = -torch.rand(1, 70, 2); b = torch.rand(1, 70, 2)
        o, s = gdn.gated_delta_rule(q, k, v, g, b, output_final_state=True)
        try:
            gdn.gated_delta_rule(q, k, v, g, b, backend='triton')
            err = None
        except gdn.UnsupportedGDNRequest as exc:
            err = str(exc)
        print(json.dumps({'shape': list(o.shape), 'finite': bool(o.isfinite().all()), 'error': err,
                          'triton_loaded': 'triton' in sys.modules}))
        """
    )
    assert result["shape"] == [1, 70, 2, 8] and result["finite"]
    assert result["triton_loaded"] is False
    assert result["error"] is not None


def test_service_and_workers_metadata_do_not_import_torch():
    loaded = _run(
        """
        import json, sys
        import service, service.cli, workers.registry, workers.suite, workers.executors.base
        from workers.registry import get_suite, suite_names
        for name in suite_names():
            get_suite(name).describe()
        print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'kernels'))))
        """
    )
    assert loaded == []


def test_cli_version_and_help():
    runner = CliRunner()
    result = runner.invoke(main, ["version"])
    assert result.exit_code == 0
    commit = source_commit()
    assert result.output.startswith("gdnval 0.")
    if commit is not None:
        assert commit in result.output
    helped = runner.invoke(main, ["--help"])
    assert helped.exit_code == 0 and "version" in helped.output


def test_source_modified_tells_an_edited_checkout_from_a_clean_one(tmp_path):
    import subprocess

    from workers.provenance import source_modified

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    (tmp_path / "untracked.txt").write_text("ignored by the check\n")
    assert source_modified.__wrapped__(tmp_path) is False
    (tmp_path / "a.py").write_text("x = 2\n")
    assert source_modified.__wrapped__(tmp_path) is True
    assert source_modified.__wrapped__(tmp_path / "not-a-repo") is None

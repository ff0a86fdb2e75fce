"""Layering rules, checked in fresh interpreters: what each top-level import may load."""

from __future__ import annotations

import ast
import graphlib
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

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


# ------------------------------------------------------------------ the service's inner layers

ROOT = Path(__file__).resolve().parents[1]
# The service's layers, lowest first: a module may import its own layer or a lower one, never a
# higher one. `shared` modules (settings, the login cookie, the executor factory) import no
# other layer; the ORM rows and the engine sit under every persistence module. The presentation
# (view models, Markdown) renders what the domain decided, never the other way round. The API,
# the pages and the domain pass a session along but query only through persistence.
SERVICE_LAYERS: dict[str, int] = {
    "service.settings": 0, "service.web_session": 0, "service.executor_choice": 0,
    "service.persistence.models": 1, "service.persistence.db": 1,
    "service.persistence": 2,
    "service.domain": 3,
    "service.presentation": 4,
    "service.dispatcher": 5,
    "service.api": 6, "service.web": 6,
    "service.app": 7, "service.cli": 7, "service.__main__": 7, "service": 7,
}
LAYER_NAMES = {0: "shared", 1: "models", 2: "persistence", 3: "domain", 4: "presentation", 5: "dispatcher",
               6: "api/web", 7: "entry"}
# What the SQL-free layers (api, web, domain) may take from SQLAlchemy: types to pass along.
SQL_FREE = ("service.api", "service.web", "service.domain", "service.presentation")
SQL_TYPES = frozenset({"sqlalchemy.Engine", "sqlalchemy.orm.Session"})
# Across packages: service -> workers -> gdn -> kernels.
PACKAGE_RANK = {"kernels": 0, "gdn": 1, "workers": 2, "service": 3}


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _layer(module: str) -> int | None:
    best = max((p for p in SERVICE_LAYERS if _under(module, p)), key=len, default=None)
    return None if best is None else SERVICE_LAYERS[best]


def _imported(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, module) of every import in the file, inside functions too; `from a import b` names
    `a.b` when that is a module of ours or `a` is a library, else `a`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if node.module.split(".")[0] not in PACKAGE_RANK:  # a library's: the name itself
                    yield node.lineno, sub
                    continue
                is_module = (ROOT / sub.replace(".", "/")).with_suffix(".py").is_file() or (
                    ROOT / sub.replace(".", "/") / "__init__.py").is_file()
                yield node.lineno, sub if is_module else node.module


def import_violations(module: str, source: str) -> list[str]:
    """Every import of `module` (given its source) that points up a layer, each named."""
    out: list[str] = []
    package = module.split(".")[0]
    here = _layer(module)
    for line, target in _imported(ast.parse(source)):
        top = target.split(".")[0]
        if top in PACKAGE_RANK and package in PACKAGE_RANK and PACKAGE_RANK[top] > PACKAGE_RANK[package]:
            out.append(f"{module}:{line} imports {target}: {package} never imports {top}")
            continue
        sql_free = next((p for p in SQL_FREE if _under(module, p)), None)
        if sql_free and _under(target, "sqlalchemy") and target not in SQL_TYPES and not _under(
            target, "sqlalchemy.exc"
        ):
            out.append(f"{module}:{line} imports {target}: {sql_free} runs no SQL of its own")
            continue
        if here is None or top != "service":
            continue
        there = _layer(target)
        if there is None:
            why = "no service layer lists it"
        elif there > here:
            why = f"{LAYER_NAMES[here]} never imports {LAYER_NAMES[there]}"
        elif _under(module, "service.api") and _under(target, "service.web"):
            why = "the API never imports the pages"
        elif _under(module, "service.web") and _under(target, "service.api") and target != "service.api.deps":
            why = "the pages share only service.api.deps with the API"
        elif _under(module, "service.cli") and any(
            _under(target, p) for p in ("service.api", "service.web", "service.dispatcher")
        ):
            why = "the CLI talks to the API through service.cli.client"
        else:
            continue
        out.append(f"{module}:{line} imports {target}: {why}")
    return list(dict.fromkeys(out))


def _modules() -> Iterator[tuple[str, Path]]:
    for package in PACKAGE_RANK:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def test_imports_point_down_the_layers_inside_the_service_and_across_packages():
    bad = [v for module, path in _modules() for v in import_violations(module, path.read_text())]
    assert not bad, "imports pointing up a layer:\n" + "\n".join(bad)
    assert {_layer(m) for m, _ in _modules() if m.startswith("service")} >= set(LAYER_NAMES)


def test_the_layer_check_names_an_upward_import():
    upward = "from service.api.deps import get_session\n\ndef f():\n    from service.domain import gate\n"
    found = import_violations("service.persistence.jobs", upward)
    assert found == [
        "service.persistence.jobs:1 imports service.api.deps: persistence never imports api/web",
        "service.persistence.jobs:4 imports service.domain.gate: persistence never imports domain",
    ]
    assert import_violations("service.api.routes.jobs", "import service.web.deps\n") == [
        "service.api.routes.jobs:1 imports service.web.deps: the API never imports the pages"
    ]
    assert import_violations("gdn.ops", "from workers.registry import get_suite\n") == [
        "gdn.ops:1 imports workers.registry: gdn never imports workers"
    ]
    assert import_violations("service.web.routes.history", "from sqlalchemy import select\n") == [
        "service.web.routes.history:1 imports sqlalchemy.select: service.web runs no SQL of its own"
    ]
    assert import_violations("service.domain.gate", "from service.persistence import queue\n") == []


def orm_row_imports(module: str, source: str) -> list[str]:
    """Every ORM row (a `*Row` or the declarative `Base` of `service.persistence.models`) that a
    domain module imports: the domain takes plain records from persistence, never rows."""
    if not _under(module, "service.domain"):
        return []
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if _under(node.module, "service.persistence.models"):
                out += [f"{module}:{node.lineno} imports the ORM row {a.name}" for a in node.names
                        if a.name.endswith("Row") or a.name in ("Base", "*")]
            elif node.module == "service.persistence" and any(a.name == "models" for a in node.names):
                out.append(f"{module}:{node.lineno} imports service.persistence.models")
        elif isinstance(node, ast.Import):
            out += [f"{module}:{node.lineno} imports {a.name}" for a in node.names
                    if _under(a.name, "service.persistence.models")]
    return out


def test_the_domain_imports_no_orm_rows():
    bad = [v for module, path in _modules() for v in orm_row_imports(module, path.read_text())]
    assert not bad, "the domain takes records (service.persistence.records), not rows:\n" + "\n".join(bad)
    rows_and_a_constant = "from service.persistence.models import JobRow, FINAL_STATUSES\n"
    assert orm_row_imports("service.domain.gate", rows_and_a_constant) == [
        "service.domain.gate:1 imports the ORM row JobRow"
    ]
    assert orm_row_imports("service.domain.gate", "def f():\n    import service.persistence.models\n") == [
        "service.domain.gate:2 imports service.persistence.models"
    ]
    assert orm_row_imports("service.web.routes.job", "from service.persistence.models import JobRow\n") == []


def import_cycle(sources: dict[str, str]) -> list[str] | None:
    """One cycle among `sources`' modules (module -> its source), counting imports inside
    functions too (a function-level import only hides a cycle until that function runs), or None."""
    graph: dict[str, set[str]] = {}
    for module, source in sources.items():
        targets = set()
        for _, target in _imported(ast.parse(source)):
            while target not in sources and "." in target:  # `from pkg.mod import name` -> pkg.mod
                target = target.rsplit(".", 1)[0]
            if target in sources and target != module:
                targets.add(target)
        graph[module] = targets
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def test_gdn_and_kernels_import_no_module_of_their_own_in_a_cycle():
    for package in ("gdn", "kernels"):
        sources = {m: p.read_text() for m, p in _modules() if _under(m, package)}
        cycle = import_cycle(sources)
        assert cycle is None, f"{package} imports in a cycle: {' -> '.join(cycle or [])}"


def test_the_cycle_check_finds_one_behind_a_function_level_import():
    found = import_cycle({
        "gdn.ops": "def f():\n    from gdn.backends import get_backend\n",
        "gdn.backends": "from gdn.ops import GDNShape\n",
        "gdn.capability": "",
    })
    assert found is not None and set(found) == {"gdn.ops", "gdn.backends"}
    assert import_cycle({"gdn.ops": "from gdn.backends import get_backend\n", "gdn.backends": ""}) is None


# ------------------------------------------------------------------ the suites: spec + run

SUITES_PACKAGE = "workers.suites"
SHARED = f"{SUITES_PACKAGE}.shared"  # what the suites share; a suite of its own it is not


def _suite_of(module: str) -> str | None:
    """The suite package a module of workers/suites belongs to (`workers.suites.cp_layer`), or
    None for one outside them (the shared package, the package itself, anything else)."""
    parts = module.split(".")
    if module.startswith(SUITES_PACKAGE + ".") and len(parts) > 2 and not _under(module, SHARED):
        return ".".join(parts[:3])
    return None


def _absolute_imports(module: str, tree: ast.AST, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, module) of every import, relative ones made absolute, `from a import b` as `a.b`."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            source = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                yield node.lineno, f"{source}.{alias.name}"


def suite_violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """Every import by which a module of one suite reaches another suite's modules, or by which the
    shared package reaches any suite."""
    mine = _suite_of(module)
    shared = _under(module, SHARED)
    out: list[str] = []
    for line, target in _absolute_imports(module, ast.parse(source), is_package):
        theirs = _suite_of(target)
        if theirs is None or theirs == mine:
            continue
        if shared:
            out.append(f"{module}:{line} imports {target}: the shared package imports no suite")
        elif mine is not None:
            out.append(f"{module}:{line} imports {target}: a suite imports no other suite")
    return list(dict.fromkeys(out))


def _suite_modules() -> Iterator[tuple[str, Path]]:
    return ((m, p) for m, p in _modules() if _under(m, SUITES_PACKAGE))


def test_no_suite_imports_another():
    bad = [
        v for module, path in _suite_modules()
        for v in suite_violations(module, path.read_text(), path.name == "__init__.py")
    ]
    assert not bad, "suites importing one another:\n" + "\n".join(bad)


def test_the_suite_check_names_an_import_of_another_suite():
    assert suite_violations("workers.suites.cp_layer.spec", "from workers.suites.gdn_op.spec import X\n") == [
        "workers.suites.cp_layer.spec:1 imports workers.suites.gdn_op.spec.X: a suite imports no other suite"
    ]
    assert suite_violations("workers.suites.network.run", "def f():\n    from ..profile import run\n") == [
        "workers.suites.network.run:2 imports workers.suites.profile.run: a suite imports no other suite"
    ]
    assert suite_violations("workers.suites.shared.run", "import workers.suites.network.spec\n") == [
        "workers.suites.shared.run:1 imports workers.suites.network.spec: the shared package imports no suite"
    ]
    own = "from workers.suites.cp_layer.spec import TENSORS\nfrom workers.suites.shared.spec import CHUNK\n"
    assert suite_violations("workers.suites.cp_layer.run", own) == []
    assert suite_violations("workers.suites.cp_layer", "from . import spec\n", is_package=True) == []


def test_built_in_suites_are_a_spec_and_a_run_module_each():
    """The registry names each built-in suite's spec; the spec names the run module beside it."""
    from workers.registry import SUITE_MODULES, get_suite

    packages = sorted(p.parent.name for p in (ROOT / "workers" / "suites").glob("*/__init__.py"))
    built_in = {n: m for n, m in SUITE_MODULES.items() if _under(m, SUITES_PACKAGE)}
    assert sorted(m.split(".")[2] for m in built_in.values()) == [p for p in packages if p != "shared"]
    for name, module in built_in.items():
        package = module.rpartition(".")[0]
        assert module == f"{package}.spec", module
        assert get_suite(name).run_module == f"{package}.run", name


def test_suite_spec_modules_import_no_torch():
    """Every spec (the shared one too) in a fresh interpreter: no torch, Triton, kernels or run module."""
    specs = sorted(m for m, _ in _suite_modules() if m.endswith(".spec"))
    assert f"{SHARED}.spec" in specs and len(specs) > 2
    loaded = _run(
        f"""
        import importlib, json, sys
        for name in {specs!r}:
            importlib.import_module(name)
        print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'kernels')
                                or m.endswith('.run') and m.startswith('{SUITES_PACKAGE}.'))))
        """
    )
    assert loaded == []

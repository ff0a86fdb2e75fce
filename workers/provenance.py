"""Which code is running: the installed version and the git commit of the source tree."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Mapping
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

SOURCE_ROOT = Path(__file__).resolve().parent.parent


def installed_version() -> str:
    try:
        return version("gdnval")
    except PackageNotFoundError:
        return "0+unknown"


@cache
def source_commit(root: Path = SOURCE_ROOT) -> str | None:
    """The commit of the source tree the code is imported from, or None outside a checkout."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and len(sha) == 40 else None


@cache
def source_modified(root: Path = SOURCE_ROOT) -> bool | None:
    """Whether tracked files differ from `source_commit` (a copied or edited tree), None outside a
    checkout: a result recorded with commit X from a modified tree is not X's result."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None


# The packages of this tree whose code a job runs (the system under test and its harness)
CODE_PACKAGES = ("gdn", "kernels", "workers")


def content_hash(paths: list[Path]) -> str | None:
    """sha256 over every file under `paths` (a file or a package folder), by relative path and
    bytes, bytecode caches left out: equal exactly when the code is byte-identical. None when no
    file is found."""
    digest = hashlib.sha256()
    found = False
    for top in paths:
        files = [top] if top.is_file() else sorted(
            f for f in top.rglob("*") if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"
        )
        for f in files:
            rel = f.name if f == top else f"{top.name}/{f.relative_to(top).as_posix()}"
            digest.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
            found = True
    return digest.hexdigest() if found else None


@cache
def source_content_hash(root: Path = SOURCE_ROOT, extra: tuple[Path, ...] = ()) -> str | None:
    """The content hash of this tree's runtime code (`CODE_PACKAGES`) and of `extra` files (a
    suite module outside them, such as a test's)."""
    return content_hash([*(root / pkg for pkg in CODE_PACKAGES if (root / pkg).is_dir()), *extra])


def module_content_hash(module: str) -> str | None:
    """The content hash of an importable top-level module's files (its package folder), or None."""
    from importlib.util import find_spec

    try:
        spec = find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return content_hash([Path(p) for p in spec.submodule_search_locations])
    return content_hash([Path(spec.origin)]) if spec.origin and Path(spec.origin).is_file() else None


def installed_module_hash(folder: Path, module: str) -> str | None:
    """The content hash of top-level module `module` as installed under `folder` (its package
    folder, or its one file): what a rank with `folder` first on its path records for it
    (`module_content_hash`), computed without importing it. None when it is not there."""
    top = module.split(".")[0]
    package, single = folder / top, folder / f"{top}.py"
    if package.is_dir():
        return content_hash([package])
    return content_hash([single]) if single.is_file() else None


def code_identity(info: Mapping[str, Any] | None) -> str | None:
    """One hash of a job's code under test from its recorded info: this tree's runtime code and the
    content of every backend it ran. None when any part is unknown (never equal by accident)."""
    info = info or {}
    parts = [info.get("code_hash")]
    parts += [b.get("content_hash") for b in info.get("backends") or []]
    if not parts or any(not isinstance(p, str) or not p for p in parts):
        return None
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


BACKEND_COMMIT_FILE = "GDNVAL_BACKEND_COMMIT"  # written beside a backend installed from a commit


def _distribution_of(module: str | None) -> str | None:
    from importlib.metadata import packages_distributions

    if not module:
        return None
    names = packages_distributions().get(module.split(".")[0]) or []
    return names[0] if names else None


def _dist_commit(dist_name: str) -> str | None:
    """The commit a distribution was installed from: ours (workers.backend_source) or pip's VCS record."""
    import json
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution(dist_name)
    except PackageNotFoundError:
        return None
    marker = Path(str(dist.locate_file(BACKEND_COMMIT_FILE)))
    if marker.is_file():
        return marker.read_text().strip() or None
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return None
    return (direct.get("vcs_info") or {}).get("commit_id")


def backend_provenance(name: str, commit: str | None = None) -> dict[str, str | None]:
    """Where backend `name`'s code comes from: its distribution, version and (when known) commit.
    Our built-ins report gdnval and `commit`, the commit of our code the job runs (a job run from
    a commit's snapshot names it: the snapshot's folder may sit inside a checkout at another
    commit), else this tree's; a backend that cannot be loaded reports the reason instead of a
    distribution."""
    from gdn.backends import get_backend
    from gdn.ops import UnsupportedGDNRequest

    try:
        backend = get_backend(name)
    except UnsupportedGDNRequest as exc:
        return {"backend": name, "distribution": None, "version": None, "commit": None, "error": str(exc)}
    top = (backend.module or getattr(backend.fn, "__module__", "") or "").split(".")[0]
    if top in ("gdn", "kernels"):
        return {"backend": name, "distribution": "gdnval", "version": installed_version(),
                "commit": commit or source_commit(), "content_hash": source_content_hash()}
    content = module_content_hash(top) if top else None
    dist = backend.distribution or _distribution_of(top)
    if dist is None:
        return {"backend": name, "distribution": None, "version": None, "commit": None, "module": top,
                "content_hash": content}
    try:
        ver = version(dist)
    except PackageNotFoundError:
        ver = None
    return {"backend": name, "distribution": dist, "version": ver, "commit": _dist_commit(dist),
            "content_hash": content}

"""Which code is running: the installed version and the git commit of the source tree."""

from __future__ import annotations

import subprocess
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

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
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None


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


def backend_provenance(name: str) -> dict[str, str | None]:
    """Where backend `name`'s code comes from: its distribution, version and (when known) commit.
    Our built-ins report gdnval and this tree's commit; a backend that cannot be loaded reports
    the reason instead of a distribution."""
    from gdn.backends import get_backend
    from gdn.ops import UnsupportedGDNRequest

    try:
        backend = get_backend(name)
    except UnsupportedGDNRequest as exc:
        return {"backend": name, "distribution": None, "version": None, "commit": None, "error": str(exc)}
    top = (backend.module or getattr(backend.fn, "__module__", "") or "").split(".")[0]
    if top in ("gdn", "kernels"):
        return {"backend": name, "distribution": "gdnval", "version": installed_version(),
                "commit": source_commit()}  # fmt: skip
    dist = backend.distribution or _distribution_of(top)
    if dist is None:
        return {"backend": name, "distribution": None, "version": None, "commit": None, "module": top}
    try:
        ver = version(dist)
    except PackageNotFoundError:
        ver = None
    return {"backend": name, "distribution": dist, "version": ver, "commit": _dist_commit(dist)}

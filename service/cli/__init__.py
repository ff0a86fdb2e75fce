"""The `gdnval` command. Each sub-command lives in its own module and imports heavy things lazily."""

from __future__ import annotations

import importlib

import click

from workers.provenance import installed_version, source_commit

# module -> name of the click command (or group) object it defines
COMMAND_MODULES: dict[str, str] = {
    "service.cli.data": "data",
    "service.cli.run": "run",
    "service.cli.serve": "serve",
    "service.cli.submit": "submit",
    "service.cli.jobs": "jobs",
    "service.cli.db": "db",
    "service.cli.gate": "gate",
    "service.cli.gates": "gates",
    "service.cli.find": "find",
    "service.cli.report": "report",
    "service.cli.compare": "compare",
    "service.cli.push": "push",
    "service.cli.campaign": "campaign",
    "service.cli.backends": "backends",
}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(installed_version(), prog_name="gdnval")
def main() -> None:
    """gdnval: validate fused Gated DeltaNet kernels and their context-parallel layouts per commit."""


@main.command()
def version() -> None:
    """Print the installed version and the git commit of the code."""
    click.echo(f"gdnval {installed_version()} (commit {source_commit() or 'unknown'})")


for _module, _attr in COMMAND_MODULES.items():
    main.add_command(getattr(importlib.import_module(_module), _attr))

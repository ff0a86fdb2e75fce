"""`gdnval data`: build token files for the network trajectories from local text (nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

import click


@click.group("data")
def data() -> None:
    """Token files for the whole-network suites."""


@data.command("build")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("texts", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
def build(out: Path, texts: tuple[Path, ...]) -> None:
    """Tokenize TEXTS byte by byte (EOS after each file) into OUT (+ OUT.json header)."""
    from gdn.data import build_token_file, header_path  # torch only when the command runs

    try:
        header = build_token_file(out, list(texts))
    except (FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"wrote {header.num_tokens} {header.dtype} tokens (vocab {header.vocab_size}) to {out}; "
        f"header {header_path(out)}"
    )

"""Launches under Triton's CPU interpreter with their programs run last to first.

A GPU runs the programs of one launch in no set order, and concurrently; the interpreter runs them
one at a time in grid order. A kernel that reads what another program of the same launch writes
(an input written over, a running sum passed through rows) can therefore pass every interpreter
test by luck of that order. Running the same launches once in grid order and once reversed puts
every pair of programs in both orders: equal bits both ways show that no program of a launch
depends on another's writes. (Ordering inside one program, between its warps, is not shown: that
is the kernel's barrier, which only a GPU run exercises.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def programs_in_reverse_order() -> Iterator[None]:
    """Inside the block, every interpreted launch runs program (x, y, z) where grid order would run
    (nx-1-x, ny-1-y, nz-1-z): each program still runs once, with its own program ids."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    in_grid_order = builder.set_grid_idx

    def reversed_index(x: int, y: int, z: int) -> None:
        nx, ny, nz = builder.grid_dim
        in_grid_order(nx - 1 - x, ny - 1 - y, nz - 1 - z)

    builder.set_grid_idx = reversed_index
    try:
        yield
    finally:
        del builder.set_grid_idx  # the class's method again

"""Driver run inside the triton-ascend environment: lower recorded launches to Linalg.

It reads a JSON list of launches on stdin (kernel module and name, the argument types and the
constexpr values the installed Triton specialised them with) and writes one JSON result per
launch on stdout: the stage it reached (`ttir`, then `linalg`, the bundled triton-adapter-opt's
output for the NPU target) and, where it stopped, the construct named by the compiler's error.
Nothing past Linalg runs: the NPU stage needs CANN's bishengir-compile. Runs under triton-ascend
3.2's API (signature and constants keyed by parameter name), so it imports nothing of the
project's test helpers, which follow the main environment's Triton.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import traceback
from typing import Any

NPU_TARGET = ("npu", "Ascend910B3", 0)  # an Atlas A2; the stages up to Linalg do not read the arch


def construct(error: str) -> str:
    """The compiler's own words for what it could not lower: the first `error:` diagnostic of
    triton-adapter-opt (with the op it names), else the last line of a front-end error."""
    for line in error.splitlines():
        found = re.search(r"error: (.*)", line)
        if found:
            return found.group(1).strip()[:300]
    # a CompilationError nests the callee's error in its repr, once per inlined call: the
    # innermost one is the construct
    inner = list(re.finditer(r"(\w+(?:Error|Exception))\(\\*[\'\"]", error))
    if inner:
        text = error[inner[-1].end():]
        text = re.split(r"\\*[\'\"]\)", text, maxsplit=1)[0]
        text = re.sub(r"\\+", "", text)
        return f"{inner[-1].group(1)}: {text}"[:300]
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "no message")[:300]


# Triton's tf32 dot precisions have no Ascend counterpart but hf32 (the front end refuses them)
ASCEND_PRECISION = {"tf32": "hf32", "tf32x3": "hf32"}


def lower_one(fn: Any, signature: dict, constexprs: dict, backend: Any, stages: dict, options: Any,
              context_of: Any) -> tuple[str, str | None, list[str]]:
    """(stage reached, construct that stopped it or None, the Linalg ops of a lowered kernel)."""
    from triton.compiler import ASTSource

    src = ASTSource(fn, dict(signature), dict(constexprs))
    metadata: dict[str, Any] = dict(options.__dict__)
    stage = "source"
    try:
        ir_mod = src.make_ir(options, backend.get_codegen_implementation(), backend.get_module_map(),
                             context_of())
        ttir = stages["ttir"](ir_mod, metadata)
        stage = "ttir"
        linalg = stages["ttadapter"](ttir, metadata)
    except subprocess.CalledProcessError as exc:
        return stage, construct(exc.stderr.decode(errors="replace") if exc.stderr else str(exc)), []
    except Exception:  # the front end's CompilationError and friends: keep its message
        return stage, construct(traceback.format_exc()), []
    return "linalg", None, sorted(set(re.findall(r"\b(linalg\.[a-z_]+)", linalg)))


def lower(launch: dict[str, Any], backend: Any, stages: dict, options: Any, context_of: Any) -> dict:
    """One launch's result; a launch the front end refuses for a tf32 precision is lowered again
    with hf32 (`ascend_*` keys), which is what an Ascend variant of the kernel would ask for."""
    fn = getattr(importlib.import_module(launch["module"]), launch["kernel"])
    stage, why, ops = lower_one(fn, launch["signature"], launch["constexprs"], backend, stages, options,
                                context_of)
    result = {"kernel": launch["kernel"], "dtype": launch["dtype"], "stage": stage, "construct": why,
              "linalg_ops": ops, "constexprs": launch["constexprs"]}
    swapped = {k: ASCEND_PRECISION.get(v, v) if isinstance(v, str) else v
               for k, v in launch["constexprs"].items()}
    if why is not None and swapped != launch["constexprs"]:
        stage, why, ops = lower_one(fn, launch["signature"], swapped, backend, stages, options, context_of)
        result.update(ascend_constexprs={k: v for k, v in swapped.items() if v != launch["constexprs"][k]},
                      ascend_stage=stage, ascend_construct=why, ascend_linalg_ops=ops)
    return result


def main() -> None:
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    backend = make_backend(GPUTarget(*NPU_TARGET))
    options = backend.parse_options({})
    stages: dict = {}
    backend.add_stages(stages, options)

    def context_of() -> Any:
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        return context

    for launch in json.load(sys.stdin):
        print(json.dumps(lower(launch, backend, stages, options, context_of)), flush=True)


if __name__ == "__main__":
    main()

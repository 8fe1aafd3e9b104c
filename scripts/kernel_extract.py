"""Take named top-level functions (Triton kernels and their torch twins) out of an installed vLLM source file into
a scratch module, without importing vLLM: the GPU machine the kernel checks run on has torch and Triton but no vLLM.
Triton's jit needs the functions in a real file, so they are written to one, decorators included."""

from __future__ import annotations

import ast
import importlib.util
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType


def load_functions(source: Path, names: Iterable[str], header: str, module_name: str, hint: str) -> ModuleType:
    """A module holding `header` and the named functions of `source`, in source order. Exits naming the missing
    functions and `hint` (what the file should be) when any is not there."""
    text = source.read_text()
    wanted = set(names)
    nodes = [node for node in ast.parse(text).body if isinstance(node, ast.FunctionDef) and node.name in wanted]
    missing = sorted(wanted - {node.name for node in nodes})
    if missing:
        sys.exit(f"{source}: missing {missing} ({hint})")
    lines = text.splitlines()
    chunks = [header]
    for node in nodes:
        start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
        chunks.append("\n".join(lines[start - 1 : node.end_lineno]) + "\n\n")
    path = Path(tempfile.mkdtemp(prefix=f"{module_name}-")) / f"{module_name}.py"
    path.write_text("".join(chunks))
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module

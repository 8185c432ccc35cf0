"""The package's layering, read from the source with `ast` (every import: top-level, in functions, under
TYPE_CHECKING): gpupin.core is the shared base and imports neither side; gpupin.entrypoint (in the image) and
gpupin.hostagent (on the host) never import each other; gpupin.core.nvml alone imports pynvml, and core needs nothing
but the standard library and pynvml (it is what the training image loads); no import cycle among the modules; the
host side's packages in layers that import only downward (no cycle between packages, the engine adapter imports no
command, the ledger no agent client) and at most MAX_LAYERS deep from the CLI to the core; no
production file over 800 lines (a guard against huge modules, not small ones: a module holds one idea, whatever
its length). Each violation is reported by file and line.

No daemon, no install: the files are read, never imported.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.host import REPO

# The import name of each production folder (pyproject.toml's package-dir).
PACKAGES = {"core": "gpupin.core", "entrypoint": "gpupin.entrypoint", "hostagent": "gpupin.hostagent"}
CORE, ENTRYPOINT, HOSTAGENT = PACKAGES.values()
NVML = "gpupin.core.nvml"
MAX_LINES = 800
MAX_LAYERS = 8  # packages on the longest import path from gpupin.hostagent.cli down to gpupin.core, both counted
# The host side's commands and their front ends: what the engine adapter and the ledger sit below.
COMMANDS: tuple[str, ...] = ("cli", "parser", "completion", "compose", "doctor", "ls", "policy", "queue", "record")
COMMANDS += ("run", "serve", "swarm")


@dataclass(frozen=True)
class Import:
    importer: str  # the importing module
    imported: str  # the module it imports: `from pkg import name` is pkg.name where that is a module, else pkg
    where: str  # file:line

    def __str__(self) -> str:
        return f"{self.where}: {self.importer} imports {self.imported}"


def module_files() -> dict[str, Path]:
    """Every production module by its import name."""
    files = {}
    for folder, package in PACKAGES.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join((package, *parts))] = path
    return files


MODULES = module_files()


def absolute(module: str, node: ast.ImportFrom) -> str:
    """The absolute name `from ... import` names, relative forms resolved against the importing module."""
    if node.level == 0:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str) -> Iterator[Import]:
    path = MODULES[module]
    where = str(path.relative_to(REPO))
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, f"{where}:{node.lineno}")
        elif isinstance(node, ast.ImportFrom):
            source = absolute(module, node)
            for alias in node.names:
                name = f"{source}.{alias.name}"
                yield Import(module, name if name in MODULES else source, f"{where}:{node.lineno}")


# One per module imported on a line (`from m import a, b` is one import of m).
IMPORTS = sorted({imp for module in MODULES for imp in imports_of(module)}, key=lambda i: (i.where, i.imported))


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def check(violations: list[str], rule: str) -> None:
    if violations:
        pytest.fail(f"{rule}:\n  " + "\n  ".join(violations), pytrace=False)


def test_the_reader_sees_every_side() -> None:
    # A guard on the test itself: a change of layout that hid the modules would pass every rule below vacuously.
    assert {CORE, ENTRYPOINT, HOSTAGENT, NVML, "gpupin.hostagent.run.launch"} <= MODULES.keys()
    assert any(i.importer == NVML and i.imported == "pynvml" for i in IMPORTS)
    assert any(within(i.importer, HOSTAGENT) and within(i.imported, CORE) for i in IMPORTS)
    # Relative imports resolve as Python does, from a module and from a package's __init__.
    assert absolute("gpupin.hostagent.ls.listing", ast.ImportFrom("view", [], 1)) == "gpupin.hostagent.ls.view"
    assert absolute("gpupin.hostagent.ls", ast.ImportFrom("view", [], 1)) == "gpupin.hostagent.ls.view"
    assert absolute("gpupin.hostagent.ls.view", ast.ImportFrom(None, [], 2)) == "gpupin.hostagent"


def test_core_imports_neither_side() -> None:
    bad = [
        str(i)
        for i in IMPORTS
        if within(i.importer, CORE) and (within(i.imported, ENTRYPOINT) or within(i.imported, HOSTAGENT))
    ]
    check(bad, "gpupin.core imports neither gpupin.entrypoint nor gpupin.hostagent")


def test_entrypoint_and_hostagent_never_import_each_other() -> None:
    bad = [
        str(i)
        for i in IMPORTS
        if (within(i.importer, ENTRYPOINT) and within(i.imported, HOSTAGENT))
        or (within(i.importer, HOSTAGENT) and within(i.imported, ENTRYPOINT))
    ]
    check(bad, "gpupin.entrypoint and gpupin.hostagent never import each other")


def test_only_the_nvml_adapter_imports_pynvml() -> None:
    bad = [str(i) for i in IMPORTS if within(i.imported, "pynvml") and i.importer != NVML]
    check(bad, f"only {NVML} imports pynvml")


def test_core_needs_only_the_standard_library_and_pynvml() -> None:
    def allowed(name: str) -> bool:
        top = name.split(".")[0]
        return within(name, CORE) or top == "pynvml" or top in sys.stdlib_module_names

    bad = [str(i) for i in IMPORTS if within(i.importer, CORE) and not allowed(i.imported)]
    check(bad, "gpupin.core imports only the standard library, pynvml and itself")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, or of one that imports itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges.get(node, ()):
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle() -> None:
    internal = [i for i in IMPORTS if i.imported in MODULES and i.imported != i.importer]
    edges: dict[str, set[str]] = {}
    for i in internal:
        edges.setdefault(i.importer, set()).add(i.imported)
    bad = []
    for component in cycles(edges):
        members = set(component)
        bad.append(f"a cycle among {', '.join(component)}, through:")
        bad += [f"    {i}" for i in internal if i.importer in members and i.imported in members]
    check(bad, "no import cycle among the modules (a function-level or TYPE_CHECKING import counts)")


def test_cycle_finder_finds_a_cycle() -> None:
    # The finder must be able to fail: a two-module loop and a longer one beside an acyclic edge.
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_production_file_over_800_lines() -> None:
    bad = []
    for path in MODULES.values():
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            bad.append(f"{path.relative_to(REPO)}:{lines}: {lines} lines")
    check(bad, f"no production .py file over {MAX_LINES} lines")


def layer(module: str) -> str:
    """A module's layer: a package of the host side (gpupin.hostagent.engine), a module directly under it
    (gpupin.hostagent.cli), or one of the other two packages as a whole (gpupin.core)."""
    parts = module.split(".")
    return ".".join(parts[:3]) if parts[1] == "hostagent" and len(parts) > 2 else ".".join(parts[:2])


def layer_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for i in IMPORTS:
        if i.imported in MODULES and layer(i.importer) != layer(i.imported):
            edges.setdefault(layer(i.importer), set()).add(layer(i.imported))
    return edges


def deepest(edges: dict[str, set[str]], start: str) -> list[str]:
    """The longest import path from `start` (the layers are acyclic: test_layers_flow_one_way)."""
    memo: dict[str, list[str]] = {}

    def walk(node: str) -> list[str]:
        if node not in memo:
            below = [walk(n) for n in sorted(edges.get(node, ()))]
            memo[node] = [node, *max(below, key=len, default=[])]
        return memo[node]

    return walk(start)


def test_layers_flow_one_way_at_most_max_layers_deep() -> None:
    edges = layer_edges()
    bad = []
    for component in cycles(edges):
        members = set(component)
        bad.append(f"a cycle among the layers {', '.join(component)}, through:")
        bad += [f"    {i}" for i in IMPORTS if layer(i.importer) in members and layer(i.imported) in members]
        bad = bad[:40]
    check(bad, "no import cycle between the host side's packages")
    path = deepest(edges, f"{HOSTAGENT}.cli")
    print(f"import graph: {len(path)} layers from the CLI to the core: {' -> '.join(path)}")
    assert len(path) <= MAX_LAYERS, f"{len(path)} layers: {' -> '.join(path)}"


def test_the_engine_adapter_imports_no_command_and_the_ledger_no_agent_client() -> None:
    commands = tuple(f"{HOSTAGENT}.{c}" for c in COMMANDS)
    rules = [
        (f"{HOSTAGENT}.engine", (*commands, f"{HOSTAGENT}.agentlink", f"{HOSTAGENT}.ledger")),
        (f"{HOSTAGENT}.ledger", (*commands, f"{HOSTAGENT}.agentlink")),
    ]
    bad = [
        str(i)
        for below, above in rules
        for i in IMPORTS
        if within(i.importer, below) and any(within(i.imported, a) for a in above)
    ]
    check(bad, "the engine adapter imports no command (nor the ledger), the ledger no command nor the agent's client")


def test_the_depth_finder_finds_the_longest_path() -> None:
    assert deepest({"a": {"b", "c"}, "c": {"d"}, "d": set()}, "a") == ["a", "c", "d"]

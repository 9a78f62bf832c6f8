"""The package's architecture, checked from its source: layers that only import downward, no
import cycles, backends that never import each other, modules of one job.

Every ``import`` statement counts, including those inside functions (a lazy import is still a
dependency). A module's layer is that of the longest prefix in :data:`LAYERS`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "dynamiq"

#: Lowest first; a module may import modules of its own layer or of lower ones only.
LAYERS: list[tuple[str, ...]] = [
    ("dynamiq.registry", "dynamiq.spec", "dynamiq.rng"),
    ("dynamiq.formats",),
    ("dynamiq.metadata",),
    ("dynamiq.kernels",),
    ("dynamiq.quantizers",),
    ("dynamiq.transforms",),
    ("dynamiq.codecs",),
    ("dynamiq.topologies",),
    ("dynamiq.pipeline", "dynamiq.baselines"),
    ("dynamiq.collectives",),
    ("dynamiq.ddp",),
    ("dynamiq.testing",),
    ("dynamiq.testbed",),
    ("dynamiq.bench",),
    ("dynamiq.cli", "dynamiq.__main__"),
]

#: Lines above which a module must say, in its docstring, why its one job needs them.
MAX_LINES = 400
JUSTIFIED = "is long because"


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Modules of the package that ``name`` imports (a name imported from a package counts as
    that package, or as its submodule when it is one)."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    found = set()
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                   for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in typing_only:  # annotations only: not a dependency at run time
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t.startswith("dynamiq") and t != name:
                found.add(t)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(name: str) -> int | None:
    best, level = -1, None
    for i, prefixes in enumerate(LAYERS):
        for pre in prefixes:
            if (name == pre or name.startswith(pre + ".")) and len(pre) > best:
                best, level = len(pre), i
    return level


def test_every_module_has_a_layer():
    missing = sorted(n for n in MODULES if n != "dynamiq" and _layer(n) is None)
    assert not missing, f"modules outside every layer of LAYERS: {missing}"


def test_imports_only_point_down():
    bad = []
    for name, deps in GRAPH.items():
        if name == "dynamiq":  # the root package re-exports the public API
            continue
        for d in deps:
            if d == "dynamiq":
                if _layer(name) != len(LAYERS) - 1:  # only the command line sits above it
                    bad.append(f"{name} imports the root package (import the module instead)")
            elif _layer(d) > _layer(name):
                bad.append(f"{name} (layer {_layer(name)}) imports {d} (layer {_layer(d)})")
    assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    # a package's __init__ re-exporting its submodules is not a cycle unless a submodule
    # imports the package back
    cycles = _cycles()
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _backend_folders() -> list[str]:
    kernels = ROOT / "kernels"
    return sorted(p.parent.name for p in kernels.glob("*/__init__.py")
                  if "BACKEND = " in p.read_text())


def test_backends_do_not_import_each_other():
    folders = _backend_folders()
    assert {"numba", "reference", "triton"} <= set(folders)
    bad = []
    for name, deps in GRAPH.items():
        for d in deps:
            for a in folders:
                for b in folders:
                    if a != b and name.startswith(f"dynamiq.kernels.{a}") and (
                            d == f"dynamiq.kernels.{b}" or d.startswith(f"dynamiq.kernels.{b}.")):
                        bad.append(f"{name} imports {d}")
            # nothing imports an implementation but itself (and the conformance checks, which
            # compare with the reference's diagnostics)
            inside = any(name.startswith(f"dynamiq.kernels.{a}") for a in folders)
            if not inside and name != "dynamiq.testing" and any(
                    d.startswith(f"dynamiq.kernels.{b}") for b in folders):
                bad.append(f"{name} imports {d}")
    assert not bad, "\n".join(sorted(bad))


def test_no_backend_name_branches_outside_kernels():
    """Components ask the kernel interface; none compares a backend's name."""
    names = _backend_folders()
    bad = []
    for name, path in MODULES.items():
        if name.startswith("dynamiq.kernels"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                consts = [c.value for c in [node.left, *node.comparators]
                          if isinstance(c, ast.Constant)]
                if any(c in names for c in consts):
                    bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert not bad, "backend-name branches: " + ", ".join(bad)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_are_small_or_say_why(name):
    path = MODULES[name]
    lines = len(path.read_text().splitlines())
    if lines <= MAX_LINES:
        return
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert JUSTIFIED in doc, (
        f"{path.relative_to(ROOT.parent)} has {lines} lines: split it by job, or say in its "
        f"docstring why its one job needs them ('... {JUSTIFIED} ...')")

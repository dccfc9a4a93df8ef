"""The package's shape, read from its source (docs/DESIGN.md, "Layers"): every module has a layer,
no module imports an outer layer, no import cycle, no private name used from another module.

Where the code breaks a rule today the break is listed below (KNOWN_*), and the tests hold the
lists exact: a new break fails, and so does a fixed one that is still listed, so the lists only
shrink.  Imports inside functions count: they close cycles just as well."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# docs/DESIGN.md's layer table (module -> layer); experiments are layer 7
LAYERS = {
    "rlhp_jax": 7, "rlhp_jax.core": 0, "rlhp_jax.tasks": 0, "rlhp_jax.compile_cache": 0, "rlhp_jax.deferred": 0, "rlhp_jax.refusal": 0, "rlhp_jax.files": 0, "rlhp_jax.preferences": 1, "rlhp_jax.config_fields": 1,
    "rlhp_jax.labels": 1, "rlhp_jax.rollout": 1,
    "rlhp_jax.reward_models": 2, "rlhp_jax.ensemble": 2, "rlhp_jax.agents": 2, "rlhp_jax.agents.common": 2,
    "rlhp_jax.agents.ppo": 2, "rlhp_jax.agents.a2c": 2, "rlhp_jax.agents.trpo": 2, "rlhp_jax.agents.dqfd": 2,
    "rlhp_jax.envs": 3, "rlhp_jax.envpool_envs": 3, "rlhp_jax.atari_masks": 3,
    "rlhp_jax.queries": 4, "rlhp_jax.schedules": 4, "rlhp_jax.demos": 4,
    "rlhp_jax.replay": 4, "rlhp_jax.human.store": 4,
    "rlhp_jax.teachers": 5, "rlhp_jax.human": 5, "rlhp_jax.human.teacher": 5, "rlhp_jax.human.server": 5,
    "rlhp_jax.human.exchange": 5, "rlhp_jax.human.instructions": 5, "rlhp_jax.human.play": 5,
    "rlhp_jax.human.play_server": 5,
    "rlhp_jax.render": 5, "rlhp_jax.render.video": 5, "rlhp_jax.render.atari": 5, "rlhp_jax.render.mujoco": 5,
    "rlhp_jax.render.classic": 5,
    "rlhp_jax.config": 6, "rlhp_jax.presets": 6, "rlhp_jax.runs": 6, "rlhp_jax.loop": 6, "rlhp_jax.driver": 6, "rlhp_jax.compiled": 6,
    "rlhp_jax.distributed": 6, "rlhp_jax.ibarz": 6, "rlhp_jax.checkpoint": 6, "rlhp_jax.metrics": 6,
    "rlhp_jax.trained": 6, "rlhp_jax.demos_cli": 7,
    "rlhp_jax.human.__main__": 7, "rlhp_jax.human.browser": 7, "rlhp_jax.render.__main__": 7,
}

KNOWN_UPWARD: set[tuple[str, str]] = set()  # (importer, imported): an inner layer reaching out; none left

KNOWN_CYCLES: set[frozenset[str]] = set()  # none left (the last one, through demos, runs and ibarz, is gone)

KNOWN_PRIVATE: set[tuple[str, str]] = set()  # (module, private name it uses that another module defines); none left

NAMEDTUPLE_API = {"_fields", "_replace", "_asdict", "_make"}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.fixture(scope="module")
def package():
    files = sorted([*(ROOT / "rlhp_jax").rglob("*.py"), *(ROOT / "experiments").glob("*.py")])
    return read_package(files, ROOT)


def read_package(files: list[Path], root: Path) -> dict:
    """{module: (its imports of project modules, private names it uses from elsewhere)}."""
    sources = {_module_name(p, root): ast.parse(p.read_text(encoding="utf-8")) for p in files}

    def resolve(name):
        while name and name not in sources:
            name = name.rpartition(".")[0]
        return name or None

    out = {}
    for module, tree in sources.items():
        defined, deps, private = set(), set(), set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                defined.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps.update(filter(None, (resolve(a.name) for a in node.names)))
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    target = full if full in sources else resolve(node.module)
                    if target:
                        deps.add(target)
                        if a.name.startswith("_") and not a.name.startswith("__"):
                            private.add(a.name)
            elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                  and node.attr not in defined and node.attr not in NAMEDTUPLE_API):
                private.add(node.attr)
        out[module] = (deps - {module}, private)
    return out


def upward_imports(package, layers) -> set[tuple[str, str]]:
    layer = lambda m: layers.get(m, 7)
    return {(m, d) for m, (deps, _) in package.items() for d in deps if layer(d) > layer(m)}


def import_cycles(package) -> set[frozenset[str]]:
    graph = {m: deps for m, (deps, _) in package.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), set()

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.add(frozenset(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def private_uses(package) -> set[tuple[str, str]]:
    return {(m, name) for m, (_, names) in package.items() for name in names}


def test_the_checks_find_planted_breaks(tmp_path):
    """The scan itself works: a small package with one break of each kind, imports inside
    functions included, is reported exactly."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from pkg import high\n    return high.g()\n")
    (pkg / "high.py").write_text("import pkg.low\n\ndef g():\n    return pkg.low._secret\n")
    (pkg / "other.py").write_text("from pkg.high import _hidden\n")
    found = read_package(sorted(pkg.glob("*.py")), tmp_path)
    assert upward_imports(found, {"pkg.low": 1, "pkg.high": 6, "pkg.other": 6}) == {("pkg.low", "pkg.high")}
    assert import_cycles(found) == {frozenset({"pkg.low", "pkg.high"})}
    assert private_uses(found) == {("pkg.high", "_secret"), ("pkg.other", "_hidden")}


def test_every_module_has_a_layer(package):
    assert sorted(m for m in package if m.startswith("rlhp_jax") and m not in LAYERS) == []


def test_no_module_imports_an_outer_layer(package):
    upward = upward_imports(package, LAYERS)
    assert upward - KNOWN_UPWARD == set(), "new upward imports"
    assert KNOWN_UPWARD - upward == set(), "fixed: remove them from KNOWN_UPWARD"


def test_no_import_cycles(package):
    assert import_cycles(package) == KNOWN_CYCLES


def test_no_private_name_crosses_modules(package):
    used = private_uses(package)
    assert used - KNOWN_PRIVATE == set(), "new private names used across modules"
    assert KNOWN_PRIVATE - used == set(), "fixed: remove them from KNOWN_PRIVATE"


def test_every_long_file_is_named_in_design_with_its_one_concept():
    """docs/DESIGN.md, "Files over 450 lines": each source file that long is listed (with why it is
    one concept), and no file is listed that is no longer that long."""
    import re

    text = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    table = text.split("## Files over 450 lines, and why", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([^`]+)` \| .+ \|$", table, flags=re.M))
    long = {p.relative_to(ROOT).as_posix() for folder in ("rlhp_jax", "experiments")
            for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".html")
            and len(p.read_text(encoding="utf-8").splitlines()) > 450}
    assert listed == long

"""The layers of docs/architecture.md, checked on the source: a module imports only from its own layer or the
layers below it, at the top of the module, with no import cycle."""

import ast
import json
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# From the bottom up; a module belongs to the first layer whose prefix it has.
LAYERS = [
    ("base", ("attn.core.errors", "attn.core.faults", "attn.core.config", "attn.core.presets", "attn.shipped")),
    ("model core", ("attn.core", "attn.models")),
    ("decoding", ("attn.decoding",)),
    ("data", ("attn.data",)),
    ("model loading", ("attn.artifacts",)),
    ("inference", ("attn.inference",)),
    ("training", ("attn.training",)),
    ("application", ("attn.app",)),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    if module in EMPTY_PACKAGES:  # a package that only documents its modules is loaded with each of them
        return 0
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{module} belongs to no layer: add it to docs/architecture.md and LAYERS")


SUBMODULES: set[str] = set()


def imports(tree: ast.Module) -> list[tuple[str, bool]]:
    """(imported attn module, whether at module level) for every import of an attn module."""
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from attn.pkg import submodule` imports the submodule (after the package's __init__)
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in SUBMODULES else node.module
                     for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        found += [(name, id(node) in top) for name in names if name == "attn" or name.startswith("attn.")]
    return found


SUBMODULES.update(module_name(path) for path in SRC.glob("attn/**/*.py"))
MODULES = {module_name(path): ast.parse(path.read_text(encoding="utf-8")) for path in SRC.glob("attn/**/*.py")}
EMPTY_PACKAGES = {module_name(path) for path in SRC.glob("attn/**/__init__.py")
                  if module_name(path) != "attn" and not imports(MODULES[module_name(path)])}


def test_every_module_imports_only_from_its_layer_or_below():
    upward = []
    for module, tree in MODULES.items():
        if module == "attn":  # the package's face re-exports the public names of every layer
            continue
        for imported, _ in imports(tree):
            if imported != "attn" and layer_of(imported) > layer_of(module):
                upward.append(f"{module} ({LAYERS[layer_of(module)][0]}) imports {imported} "
                              f"({LAYERS[layer_of(imported)][0]})")
    assert not upward, "\n".join(upward)


def test_attn_modules_are_imported_at_the_top_of_a_module():
    local = [f"{module} imports {imported} inside a function" for module, tree in MODULES.items()
             for imported, at_top in imports(tree) if not at_top]
    assert not local, "\n".join(local)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (module -> modules it imports), or None."""
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for nxt in sorted(graph.get(module, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, nxt])):
                return cycle
        state[module] = 2
        return None

    return next((cycle for module in sorted(graph) if module not in state and (cycle := visit(module, [module]))),
                None)


def test_no_import_cycle():
    graph = {module: {imported for imported, _ in imports(tree) if imported in MODULES and imported != module}
             for module, tree in MODULES.items() if module != "attn"}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_a_module_that_imports_upward_is_caught():
    tree = ast.parse("from attn.training.run import train\n")
    (imported, at_top), = imports(tree)
    assert layer_of(imported) > layer_of("attn.models.build") and at_top
    inner = ast.parse("def f():\n    from attn.app import cli\n")
    assert imports(inner) == [("attn.app.cli", False)]


def test_importing_a_layer_loads_no_layer_above_it():
    """In a fresh interpreter, `import attn.<layer>` loads no module of a higher layer: the package's face
    (`attn/__init__.py`) imports its public names lazily."""
    tops = {"base": "attn.core.config", "model core": "attn.models", "decoding": "attn.decoding", "data": "attn.data",
            "model loading": "attn.artifacts", "inference": "attn.inference", "training": "attn.training"}
    script = ("import json, sys, importlib; importlib.import_module(sys.argv[1]); "
              "print(json.dumps(sorted(m for m in sys.modules if m == 'attn' or m.startswith('attn.'))))")
    for index, (layer, _) in enumerate(LAYERS[:-1]):
        loaded = json.loads(subprocess.run([sys.executable, "-c", script, tops[layer]], check=True,
                                           capture_output=True, text=True).stdout)
        above = [m for m in loaded if m != "attn" and layer_of(m) > index]
        assert not above, f"import {tops[layer]} loads {above}"
    public = subprocess.run([sys.executable, "-c", "import attn; print(attn.translate.__module__, attn.__all__)"],
                            check=True, capture_output=True, text=True).stdout
    assert public.startswith("attn.inference.") and "'train'" in public

"""Layers point one way: core/ (the rule, sampling, the round loop, the draft contract) imports
nothing above it, and loading models needs no draft strategy."""

import ast
import json
import subprocess
import sys

import pytest

from tests.commands import REPO

CORE_MODULES = sorted(f"specexp.core.{p.stem}" for p in (REPO / "specexp" / "core").glob("*.py")
                      if p.stem != "__init__")


# What a fresh interpreter has loaded of specexp after importing each of these (imports run at import time)
CHECKED_IMPORTS = {"core": CORE_MODULES, "specexp.models": ["specexp.models"], "specexp.data": ["specexp.data"],
                   "specexp.runtime": ["specexp.runtime"]}
PURGED_IMPORTS = """
import importlib, json, sys
checks = json.loads(sys.argv[1])
for modules in checks.values():  # the third-party packages, loaded once; specexp's own are dropped next
    [importlib.import_module(m) for m in modules]
loaded = {}
for name, modules in checks.items():
    for m in [m for m in sys.modules if m == "specexp" or m.startswith("specexp.")]:
        del sys.modules[m]
    [importlib.import_module(m) for m in modules]
    loaded[name] = sorted(m for m in sys.modules if m.startswith("specexp"))
print(json.dumps(loaded))
"""


@pytest.fixture(scope="module")
def loaded_specexp_modules() -> dict[str, set[str]]:
    """Per CHECKED_IMPORTS entry, the specexp modules that importing it loads into an interpreter holding no
    specexp module (one interpreter for all: torch and transformers load once, specexp afresh each time)."""
    out = subprocess.run([sys.executable, "-c", PURGED_IMPORTS, json.dumps(CHECKED_IMPORTS)], cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=True)
    return {name: set(modules) for name, modules in json.loads(out.stdout).items()}


@pytest.mark.xdist_group("loaded_specexp_modules")  # one worker: the interpreter runs once
def test_core_imports_nothing_above_it(loaded_specexp_modules):
    loaded = loaded_specexp_modules["core"]
    assert {m for m in loaded if m not in ("specexp", "specexp.errors") and not m.startswith("specexp.core")} == set()


@pytest.mark.xdist_group("loaded_specexp_modules")
@pytest.mark.parametrize("module", ["specexp.models", "specexp.data", "specexp.runtime"])
def test_models_data_and_runtime_need_no_draft_strategy(module, loaded_specexp_modules):
    loaded = loaded_specexp_modules[module]
    assert module in loaded and not {m for m in loaded if m.startswith(("specexp.drafts", "specexp.distill"))}


# specexp's packages and top-level modules, lowest first: each imports only from its own layer or below.
LAYERS = [
    # leaves: one-line errors, whole-file writes and tables, where configs and the cache are, the commands' helpers,
    # composing a command's configs
    {"errors", "output", "paths", "cli", "configs"},
    {"core"},  # the rule, sampling, the KV cache, the round loop, the draft contract, the metrics
    {"draft_vocab"},
    {"models", "data"},  # loading targets, drafts' weights and prompt sets
    {"runtime"},  # how a model's step runs
    {"ngram"},  # the corpus drafts' data structures
    {"drafts"},  # the draft strategies
    {"costs"},  # the hardware profile and the cost model
    {"k_policy"},  # draft.k's policies: how many tokens each round drafts
    {"study", "distill"},  # one run of a study; training drafts
    {"reporting"},  # collecting, tables, figures, re-pricing, the dashboard
    {"__main__", "profile", "collect", "figures", "reprice", "dashboard", "pairing", "export"},  # the commands
]


def import_graph() -> dict[str, set[str]]:
    """specexp's modules -> the specexp modules each imports anywhere in its file (lazy imports too)."""
    root = REPO / "specexp"

    def name(path):
        parts = path.relative_to(REPO).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    files = {name(p): p for p in root.rglob("*.py")}
    graph = {}
    for module, path in files.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specexp"):
                deps |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                         for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("specexp.")}
        graph[module] = {d for d in deps if d in files and d != module}
    return graph


def unit(module: str) -> str:
    """specexp.costs.hardware_profile -> costs; specexp.cli -> cli."""
    return module.split(".")[1] if "." in module else module


def test_no_import_circle_anywhere():
    graph = import_graph()
    finished, on_path = set(), []

    def visit(module):
        on_path.append(module)
        for dep in sorted(graph[module]):
            assert dep not in on_path, "import circle: " + " -> ".join(on_path[on_path.index(dep):] + [dep])
            if dep not in finished:
                visit(dep)
        on_path.pop()
        finished.add(module)

    for module in sorted(graph):
        if module not in finished:
            visit(module)


def test_every_import_points_down_the_layers():
    rank = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    graph = import_graph()
    units = {unit(m) for m in graph} - {"specexp"}
    assert units <= set(rank), f"place these in LAYERS: {sorted(units - set(rank))}"
    upward = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                    if unit(m) != "specexp" and rank[unit(d)] > rank[unit(m)])
    assert not upward, f"imports that point up the layers: {upward}"


# Contracts declared by the parts that hold them, never asked of an object: the draft's (DraftTraits), a
# forward's (core/kv.ForwardTraits, declared by the decoders), a student's (models.StudentTraits, set by its
# builder), the compiled runtime's (PreparedRuntime.compiled).
PROBED_CONTRACTS = {"CompiledDecoder", "LeanDecoder", "EarlyExitModel", "FeatureHead", "PreTrainedModel", "EagleHead",
                    "MedusaHeads", "ExitHead", "generate", "reads_target_ids", "traits", "shares_target_pass",
                    "hidden_layers", "mode", "takes_block_mask", "takes_static_cache", "held_cache"}


def probes(tree: ast.AST) -> list[str]:
    """Each isinstance / hasattr / getattr call in a module that asks about one of PROBED_CONTRACTS."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "hasattr",
                                                                                               "getattr"):
            asked = {n.id for arg in node.args[1:] for n in ast.walk(arg) if isinstance(n, ast.Name)}
            asked |= {n.value for arg in node.args[1:] for n in ast.walk(arg) if isinstance(n, ast.Constant)}
            if asked & PROBED_CONTRACTS:
                found.append(f"line {node.lineno}: {node.func.id}(..., {', '.join(map(str, sorted(asked)))})")
    return found


def test_drafts_forwards_students_and_the_compiled_runtime_are_declared_not_probed():
    found = {str(path.relative_to(REPO)): hits for path in sorted((REPO / "specexp").rglob("*.py"))
             if (hits := probes(ast.parse(path.read_text())))}
    assert not found, f"probes of a declared contract (declare it instead): {found}"


def test_the_probe_finder_finds_a_probe():
    assert probes(ast.parse("ok = isinstance(x, CompiledDecoder) or hasattr(m, 'generate')")) == [
        "line 1: isinstance(..., CompiledDecoder)", "line 1: hasattr(..., generate)"]

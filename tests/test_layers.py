"""Layers point one way: core/ (the rule, sampling, the round loop, the draft contract) imports
nothing above it, and loading models needs no draft strategy."""

import subprocess
import sys

import pytest

from tests.commands import REPO

CORE_MODULES = sorted(f"specexp.core.{p.stem}" for p in (REPO / "specexp" / "core").glob("*.py") if p.stem != "__init__")


def loaded_specexp_modules(*modules: str) -> set[str]:
    """The specexp modules a fresh interpreter has loaded after importing ``modules``."""
    code = f"import sys; import {', '.join(modules)}; print(' '.join(m for m in sys.modules if m.startswith('specexp')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    return set(out.stdout.split())


def test_core_imports_nothing_above_it():
    loaded = loaded_specexp_modules(*CORE_MODULES)
    assert {m for m in loaded if m not in ("specexp", "specexp.errors") and not m.startswith("specexp.core")} == set()


@pytest.mark.parametrize("module", ["specexp.models", "specexp.data", "specexp.runtime"])
def test_models_data_and_runtime_need_no_draft_strategy(module):
    assert not {m for m in loaded_specexp_modules(module) if m.startswith(("specexp.drafts", "specexp.distill"))}

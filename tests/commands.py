"""The project's commands as a user runs them: `python -m MODULE ARGS` from the repository root,
output captured, W&B offline (no run a test starts reaches a server)."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OFFLINE_WANDB = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def run_module(module: str, *args: str, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """``env``: the command's whole environment (default: this process's, W&B offline)."""
    env = {**os.environ, **OFFLINE_WANDB} if env is None else env
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env)


def run_specexp(*overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m specexp OVERRIDES`: a study (or, with -m, a sweep)."""
    return run_module("specexp", *overrides, timeout=timeout)


def run_distill(*args: str) -> subprocess.CompletedProcess:
    """`python -m specexp.distill ARGS`."""
    return run_module("specexp.distill", *args)


SMOKE_STUDY = ["size=smoke", "data.limit=1", "max_new_tokens=8"]  # a one-prompt, 8-token study


def run_smoke_study(*args: str) -> subprocess.CompletedProcess:
    """A one-prompt, 8-token study."""
    return run_specexp(*SMOKE_STUDY, *args)


def run_in_one_process(calls: dict[str, tuple[str, list[str]]], timeout: int = 600) -> dict[str, subprocess.CompletedProcess]:
    """``calls``: name -> (MODULE, ARGS); each `python -m MODULE ARGS` run one after another in one fresh
    interpreter (tests/one_process.py: the command as `python -m` runs it, its output and exit status its
    own), for batches of commands that stop early, so each does not pay the imports again."""
    out = subprocess.run([sys.executable, "-m", "tests.one_process"], cwd=REPO, capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, **OFFLINE_WANDB}, input=json.dumps(list(calls.values())))
    if out.returncode != 0:
        raise RuntimeError(f"tests.one_process failed: {out.stderr[-3000:]}")
    return {name: subprocess.CompletedProcess([sys.executable, "-m", module, *args], r["returncode"], r["stdout"],
                                              r["stderr"])
            for (name, (module, args)), r in zip(calls.items(), json.loads(out.stdout), strict=True)}

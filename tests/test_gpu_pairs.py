"""benchmarks/gpu_pairs.py at toy shapes on the CPU: the device benchmark's whole path (random Llamas
built from configs, the target's and the draft's steps compiled, the oracle at set alphas running
the draft model for its cost, realized and analytic speedups) runs in every suite, so it cannot rot
before a device is lent. backend=eager keeps it to seconds (tests/runtime/test_compiled.py generates code)."""

import json
import subprocess
import sys

import pytest

from specexp.core.metrics import expected_tokens_per_round
from tests.commands import REPO, default_env


def test_gpu_pairs_runs_at_toy_shapes_and_prices_each_pair(tmp_path):
    out = tmp_path / "pairs.md"
    run = subprocess.run([sys.executable, "gpu_pairs.py", "--shapes", "toy", "--backend", "eager",
                          "--alphas", "0.6,1.0", "--ks", "2,3", "--prompts", "2", "--max-new-tokens", "16",
                          "--out", str(out)],
                         cwd=REPO / "benchmarks", capture_output=True, text=True, timeout=600, env=default_env())
    assert run.returncode == 0, run.stderr[-3000:]
    results = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    costs = next(r for r in results if r["stage"] == "costs")
    pairs = [r for r in results if r["stage"] == "pair"]
    assert {(r["k"], r["alpha"]) for r in pairs} == {(2, 0.6), (2, 1.0), (3, 0.6), (3, 1.0)}
    for r in pairs:
        assert r["identical"], r  # greedy output is the target's, whatever the oracle proposes
        assert r["analytic"] == pytest.approx(expected_tokens_per_round(r["alpha"], r["k"])
                                              / (r["k"] * costs["c"] + r["v"]))
        assert r["realized_over_analytic"] == pytest.approx(r["speedup"] / r["analytic"])
        if r["alpha"] == 1.0:  # every proposal is the target's own continuation
            assert r["alpha_measured"] == 1.0 and r["tau"] > r["k"]
    assert 0 < costs["c"] < 1 and costs["ar_compiled_ms"] > 0 and "| K | alpha |" in out.read_text()

"""A wheel carries the configs: built from the checkout, installed where the repository is not on the
path, `python -m specexp` composes and runs a smoke study from another folder, with a user's own
experiment file outside the repository found the Hydra way (--config-dir)."""

import json
import os
import subprocess
import sys
import zipfile

import pytest

from tests.commands import OFFLINE_WANDB, REPO

USER_EXPERIMENT = """# @package _global_
# A user's study, kept outside the repository.
defaults:
  - override /draft: none
experiment_name: mine
max_new_tokens: 4
"""


def run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=900, **kwargs)


@pytest.mark.default_target
def test_a_wheel_install_composes_and_runs_a_user_experiment_from_another_folder(tmp_path):
    wheels, site, elsewhere, user_conf = (tmp_path / name for name in ("wheels", "site", "elsewhere", "my_conf"))
    build = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)])
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = next(wheels.glob("specexp-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert {"specexp/conf/config.yaml", "specexp/conf/experiment/aa_control.yaml",
            "specexp/conf/draft/none.yaml"} <= set(names)
    install = run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(site),
                   str(wheel)])
    assert install.returncode == 0, install.stderr[-3000:]

    (user_conf / "experiment").mkdir(parents=True)
    (user_conf / "experiment" / "mine.yaml").write_text(USER_EXPERIMENT)
    elsewhere.mkdir()
    env = {**os.environ, **OFFLINE_WANDB, "PYTHONPATH": str(site)}  # the installed copy, not the checkout
    where = run([sys.executable, "-c",
                 "import specexp.paths; print(specexp.paths.__file__); print(specexp.paths.CONFIG_DIR)"],
                cwd=elsewhere, env=env)
    module_file, config_dir = where.stdout.split()
    assert module_file.startswith(str(site)) and config_dir == str(site / "specexp" / "conf")

    out = run([sys.executable, "-m", "specexp", "--config-dir", str(user_conf), "experiment=mine", "size=smoke",
               "data.limit=1", "hydra.run.dir=run"], cwd=elsewhere, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((elsewhere / "run" / "summary.json").read_text())
    assert summary["draft"] == "none" and summary["greedy_match"] == 1.0  # the config's name
    # one prompt, one batch: no spread to give an interval, and the summary says so
    assert summary["speedup_ci95"] is None and summary["interval_notes"]["speedup"] == "batches: 1, fewer than 2"

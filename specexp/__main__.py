"""`python -m specexp [overrides]`: compose the config, run one study, print its summary.

The entry only wires: everything it calls computes and returns. Bad input ends with one
line on stderr, exit code 2, and no results written.
"""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from specexp.cli import fail, remove_run_folder, user_error
from specexp.configs import check_before_hydra, missing_value
from specexp.errors import DraftDoesNotApply, UserInputError
from specexp.paths import CONFIG_DIR


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    label = hydra_cfg.job.override_dirname or "run"
    missing = missing_value(cfg, hydra_cfg.runtime.choices)
    if missing is not None and not multirun:  # answered before the study's imports below (seconds of torch's)
        remove_run_folder(out_dir)
        fail(missing)
    from specexp.reporting.report import done_line, print_summary
    from specexp.study.results import JobResults
    from specexp.study.run import config_hash, run_job

    results = JobResults(out_dir, config_hash(cfg))
    if not cfg.force and (done := results.completed_summary()) is not None:
        print(f"[skip] {label}: finished earlier with this config (force=true reruns it)")
        return done["speedup"]
    try:
        if missing is not None:  # a sweep records the job as failed and goes on
            raise UserInputError(missing)
        summary = run_job(cfg, results)
    except Exception as exc:
        error = user_error(exc)
        if multirun and isinstance(error, DraftDoesNotApply):  # a pairing sweep's cell that cannot exist
            results.record_failure(error, status="skipped")
            print(f"[skipped] {label}: {error}")
            return None
        if multirun:  # one failing job is recorded and the sweep goes on
            results.record_failure(exc)
            print(f"[failed] {label}: {error or exc}", file=sys.stderr)
            return None
        if error is None:
            results.record_failure(exc)
            raise
        remove_run_folder(out_dir)
        fail(error)
    if multirun:
        print(done_line(label, summary))
    else:
        print_summary(summary, out_dir)
    return summary["speedup"]  # what a sweeper optimises


def check_study_values(cfg: DictConfig) -> None:
    from specexp.study.checks import check_study_config  # torch's import: only once the overrides compose

    check_study_config(cfg)


if __name__ == "__main__":
    check_before_hydra("config", sys.argv[1:], check_study_values)
    main()

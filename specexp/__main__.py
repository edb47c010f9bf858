"""`python -m specexp [overrides]`: compose the config, run one study, print its summary.

The entry only wires: everything it calls computes and returns. Bad input ends with one
line on stderr, exit code 2, and no results written.
"""

import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from specexp.errors import UserInputError
from specexp.report import print_summary
from specexp.study import config_hash, run_job
from specexp.tracking import JobResults

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def _user_error(exc: BaseException) -> UserInputError | None:
    """The UserInputError behind an exception, also through Hydra's InstantiationException."""
    while exc is not None:
        if isinstance(exc, UserInputError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _remove_run_folder(out_dir: Path) -> None:
    """Drop what Hydra wrote for a run that never started, so nothing half-written stays."""
    for folder in (".hydra", ".partial"):
        shutil.rmtree(out_dir / folder, ignore_errors=True)
    for log_file in out_dir.glob("*.log"):
        log_file.unlink()
    if out_dir.exists() and not any(out_dir.iterdir()):
        out_dir.rmdir()


def unknown_choice(args: list[str], config_dir: str = CONFIG_DIR) -> str | None:
    """One-line error for ``group=option`` overrides naming an option that has no config file.

    Hydra reports the same thing over a dozen lines; this names the bad value and the
    allowed ones. Sweep expressions (``choice(...)``, ``range(...)``) are left to Hydra.
    """
    for arg in args:
        group, sep, value = arg.partition("=")
        group_dir = Path(config_dir) / group.lstrip("+")
        if not sep or "(" in value or not group_dir.is_dir():
            continue
        allowed = sorted(f.stem for f in group_dir.glob("*.yaml"))
        for option in value.split(","):
            if option not in allowed:
                return f"unknown {group.lstrip('+')} '{option}'; allowed: {', '.join(allowed)}"
    return None


def missing_value(cfg: DictConfig, choices: dict, config_dir: str = CONFIG_DIR) -> str | None:
    """One-line error for a required value (``???``) left unset, naming the key, the option that
    needs it and what it takes (the comment on its line in that option's file)."""
    for key in sorted(OmegaConf.missing_keys(cfg)):
        group, _, name = key.partition(".")
        option = choices.get(group)
        line = ""
        if option is not None and (path := Path(config_dir) / group / f"{option}.yaml").is_file():
            line = next((ln for ln in path.read_text().splitlines() if ln.startswith(f"{name}:")), "")
        takes = line.partition("#")[2].strip()
        needed_by = f" by {group}={option}" if option else ""
        return f"{key} is required{needed_by} and has no value; give {key}=VALUE" + (f" ({takes})" if takes else "")
    return None


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    label = hydra_cfg.job.override_dirname or "run"
    results = JobResults(out_dir, config_hash(cfg))
    if not cfg.force and (done := results.completed_summary()) is not None:
        print(f"[skip] {label}: finished earlier with this config (force=true reruns it)")
        return done["speedup"]
    try:
        if (message := missing_value(cfg, hydra_cfg.runtime.choices)) is not None:
            raise UserInputError(message)
        summary = run_job(cfg, results)
    except Exception as exc:
        error = _user_error(exc)
        if multirun:  # one failing job is recorded and the sweep goes on
            results.record_failure(exc)
            print(f"[failed] {label}: {error or exc}", file=sys.stderr)
            return None
        if error is None:
            results.record_failure(exc)
            raise
        _remove_run_folder(out_dir)
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    if multirun:
        print(f"[done] {label}: alpha={summary['alpha']:.3f} tau={summary['tau']:.3f} speedup={summary['speedup']:.3f}")
    else:
        print_summary(summary, out_dir)
    return summary["speedup"]  # what a sweeper optimises


if __name__ == "__main__":
    if (message := unknown_choice(sys.argv[1:])) is not None:
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    main()

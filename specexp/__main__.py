"""`python -m specexp [overrides]`: compose the config, run one study, print its summary.

The entry only wires: everything it calls computes and returns. Bad input ends with one
line on stderr, exit code 2, and no results written.
"""

import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from specexp.errors import UserInputError
from specexp.report import print_summary
from specexp.study import run_from_config

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
    shutil.rmtree(out_dir / ".hydra", ignore_errors=True)
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


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def main(cfg: DictConfig) -> float | None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        summary = run_from_config(cfg, out_dir)
    except Exception as exc:
        error = _user_error(exc)
        if error is None:
            raise
        _remove_run_folder(out_dir)
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print_summary(summary, out_dir)
    return summary["speedup"]  # what a sweeper optimises


if __name__ == "__main__":
    if (message := unknown_choice(sys.argv[1:])) is not None:
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    main()

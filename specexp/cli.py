"""What the command-line entry points share (`python -m specexp`, `python -m specexp.distill`):
where the configs live, and how bad input becomes one line naming the value and what is allowed."""

import shutil
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specexp.errors import UserInputError

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def user_error(exc: BaseException) -> UserInputError | None:
    """The UserInputError behind an exception, also through Hydra's InstantiationException."""
    while exc is not None:
        if isinstance(exc, UserInputError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def remove_run_folder(out_dir: Path) -> None:
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

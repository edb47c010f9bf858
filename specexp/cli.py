"""What the command-line entry points share (`python -m specexp`, `python -m specexp.distill`, ...):
where the configs live, and how bad input becomes one line naming the value and what is allowed."""

import argparse
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from omegaconf import DictConfig, OmegaConf

from specexp.errors import UserInputError


def find_config_dir() -> str:
    """The Hydra configs: the top-level conf/ of a source checkout (and an editable install), or the
    copy a wheel or non-editable install carries inside the package (setup.py's build_py)."""
    packaged = Path(__file__).resolve().parent / "conf"
    return str(packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "conf")


CONFIG_DIR = find_config_dir()


def user_config_dirs(args: list[str]) -> list[str]:
    """Config folders a user adds on the command line, the Hydra way: ``--config-dir DIR`` / ``-cd DIR``
    and ``hydra.searchpath=[file://DIR, ...]`` (their groups are searched too)."""
    dirs = []
    for i, arg in enumerate(args):
        if arg in ("--config-dir", "-cd") and i + 1 < len(args):
            dirs.append(args[i + 1])
        elif arg.startswith("--config-dir="):
            dirs.append(arg.partition("=")[2])
        elif arg.lstrip("+").startswith("hydra.searchpath="):
            entries = arg.partition("=")[2].strip("[]").split(",")
            paths = [e.strip().strip("'\"") for e in entries]
            dirs += [p.removeprefix("file://") for p in paths if p.startswith(("file://", "/", "."))]
    return dirs


def user_error(exc: BaseException) -> UserInputError | None:
    """The UserInputError behind an exception, also through Hydra's InstantiationException."""
    while exc is not None:
        if isinstance(exc, UserInputError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def fail(message: object) -> NoReturn:
    """End a command with one `error: MESSAGE` line on stderr and exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


class CommandParser(argparse.ArgumentParser):
    """Every command's own options (argparse; Hydra overrides follow where a command composes configs):
    its --help is its own page, a bad option one `error:` line (exit 2) pointing at that page."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} ({self.prog} --help)")


def sweep_parser(prog: str, description: str, out_help: str) -> CommandParser:
    """The options of a command that reads finished jobs (collect, figures, predict): their folders,
    and where its output goes."""
    parser = CommandParser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="sweep folders (multirun/NAME) or run folders")
    parser.add_argument("--out", type=Path, default=None, help=out_help)
    return parser


@contextmanager
def one_line_errors(*expected: type[Exception]) -> Iterator[None]:
    """A UserInputError raised inside (also behind Hydra's InstantiationException), or one of the
    ``expected`` exceptions, ends the command as `fail` does; anything else keeps its traceback."""
    try:
        yield
    except Exception as exc:
        if (error := user_error(exc) or (exc if isinstance(exc, expected) else None)) is None:
            raise
        fail(error)


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
    roots = [config_dir, *user_config_dirs(args)]
    for arg in args:
        group, sep, value = arg.partition("=")
        group_dirs = [Path(root) / group.lstrip("+") for root in roots]
        if not sep or "(" in value or not any(d.is_dir() for d in group_dirs):
            continue
        allowed = sorted({f.stem for d in group_dirs for f in d.glob("*.yaml")})
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

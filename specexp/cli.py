"""What the command-line entry points share (`python -m specexp`, `python -m specexp.distill`, ...): how bad
input becomes one line naming the value and what is allowed, their option parsers, and leaving no run folder behind."""

import argparse
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from specexp.errors import UserInputError


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


def existing_path(text: str) -> Path:
    """A command's input path, refused in one line (through the parser) when it is not there."""
    if not Path(text).exists():
        raise argparse.ArgumentTypeError(f"'{text}' does not exist")
    return Path(text)


def sweep_parser(prog: str, description: str, out_help: str) -> CommandParser:
    """The options of a command that reads finished jobs (collect, figures, predict): their folders,
    and where its output goes."""
    parser = CommandParser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=existing_path, help="sweep folders (multirun/NAME) or run folders")
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


def writable_place(path: Path | None, option: str) -> None:
    """A file the command will write goes in a folder that exists: otherwise one `error:` line, before any work."""
    if path is not None and not path.parent.is_dir():
        fail(f"{option} {path}: the folder {path.parent} does not exist; give a path in an existing folder")


def remove_run_folder(out_dir: Path) -> None:
    """Drop what Hydra wrote for a run that never started, so nothing half-written stays."""
    for folder in (".hydra", ".partial"):
        shutil.rmtree(out_dir / folder, ignore_errors=True)
    for log_file in out_dir.glob("*.log"):
        log_file.unlink()
    if out_dir.exists() and not any(out_dir.iterdir()):
        out_dir.rmdir()

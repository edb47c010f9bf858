"""`python -m specexp.profile`: measure and print this machine's hardware profile for a study's
setting (the command; the profile itself is specexp/costs/hardware_profile.py)."""

import argparse
import sys
from pathlib import Path

from specexp.cli import CommandParser
from specexp.costs.hardware_profile import describe
from specexp.errors import UserInputError

DESCRIPTION = """Measure (force=true: again) and print this machine's hardware profile for a study's setting:
OVERRIDES are the same Hydra config groups and overrides as `python -m specexp` (target=, runtime=,
batch_size=, sampling=, ...); draft=a,b,... profiles several drafts. The profile is cached in
~/.cache/specexp/profiles; --out FILE also writes it there (for profile.path= on another machine)."""


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The command's options, and the Hydra overrides that follow them."""
    parser = CommandParser(prog="python -m specexp.profile", description=DESCRIPTION,
                           usage="%(prog)s [--out FILE] [OVERRIDES ...]",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="also write the profile JSON to FILE")
    options, overrides = parser.parse_known_args(argv)
    if unknown := [a for a in overrides if a.startswith("--")]:
        parser.error(f"unrecognized option {unknown[0]}")
    return options, overrides


def main(argv: list[str] | None = None) -> None:
    """`python -m specexp.profile [--out FILE] [overrides]` (DESCRIPTION)."""
    from specexp.cli import fail, one_line_errors
    from specexp.configs import compose_checked, unknown_choice
    from specexp.study.run import prepare

    options, args = parse_args(list(sys.argv[1:] if argv is None else argv))
    out = options.out
    if (message := unknown_choice(args)) is not None:
        fail(message)
    drafts = next((a.partition("=")[2].split(",") for a in args if a.startswith("draft=")), [None])
    for draft in drafts:
        overrides = [a for a in args if not a.startswith("draft=")] + ([f"draft={draft}"] if draft else [])
        with one_line_errors():
            cfg = compose_checked("config", overrides, "python -m specexp.profile")
            profile = prepare(cfg, force_profile=cfg.force).profile
            if profile is None:
                raise UserInputError("profile.enabled=false: nothing to measure")
        args = [a for a in args if not a.startswith("force=")]  # measured once; later drafts add their entries
        if out is not None:
            profile.save(out)
        print(describe(profile))
        print(f"profile: {profile.path}")


if __name__ == "__main__":
    main()

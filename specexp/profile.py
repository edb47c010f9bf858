"""`python -m specexp.profile`: measure and print this machine's hardware profile for a study's
setting (the command; the profile itself is specexp/costs/profile.py)."""

import sys
from pathlib import Path

from specexp.costs.profile import describe
from specexp.errors import UserInputError

USAGE = """usage: python -m specexp.profile [--out FILE] [OVERRIDES ...]

Measure (force=true: again) and print this machine's hardware profile for a study's setting: the
same Hydra config groups and overrides as `python -m specexp` (target=, runtime=, batch_size=,
sampling=, ...); draft=a,b,... profiles several drafts. The profile is cached in
~/.cache/specexp/profiles; --out FILE also writes it there (for profile.path= on another machine)."""


def main(argv: list[str] | None = None) -> None:
    """`python -m specexp.profile [--out FILE] [overrides]` (USAGE)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from specexp.cli import CONFIG_DIR, fail, one_line_errors, unknown_choice
    from specexp.study.run import prepare

    args = list(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(args):
        print(USAGE)
        return
    out = None
    if "--out" in args:
        i = args.index("--out")
        if i + 1 >= len(args):
            fail("--out needs a file name")
        out = Path(args.pop(i + 1))
        args.pop(i)
    if (message := unknown_choice(args)) is not None:
        fail(message)
    drafts = next((a.partition("=")[2].split(",") for a in args if a.startswith("draft=")), [None])
    for draft in drafts:
        overrides = [a for a in args if not a.startswith("draft=")] + ([f"draft={draft}"] if draft else [])
        try:
            with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
                cfg = compose("config", overrides=overrides)
        except HydraException as error:  # a malformed override or an unknown key: one line, not a traceback
            fail(f"{str(error).splitlines()[0]} (python -m specexp.profile --help)")
        with one_line_errors():
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

"""`python -m specexp.reprice SWEEP [SWEEP ...] --profile P.json [--out DIR]`: a finished sweep on other
hardware (the command; the re-pricing is specexp/reporting/repricing.py)."""

import argparse
import sys
from pathlib import Path

from specexp.cli import fail, sweep_parser, writable_place
from specexp.costs.hardware_profile import Profile
from specexp.output import markdown_table
from specexp.reporting.figure_tables import study_jobs
from specexp.reporting.repricing import reprice, write_repricing

DESCRIPTION = """A finished sweep on other hardware. Every job's rounds (what its draft proposed and the rule
accepted, round by round) are re-priced with the cost model under the profile P (say one measured
on a GPU with `python -m specexp.profile --out P.json`) next to the profile the job ran with.
Acceptance does not depend on the hardware; T(n), the draft's step and the prompt pass do. Writes
DIR/reprice.csv, reprice.md and reprice.pdf/png (default DIR: SWEEP/reprice)."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = sweep_parser("python -m specexp.reprice", DESCRIPTION, "output folder (default: FIRST_PATH/reprice)")
    parser.add_argument("--profile", type=Path, required=True, help="a profile JSON (python -m specexp.profile --out)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not args.profile.is_file():
        fail(f"--profile '{args.profile}' is not a file; python -m specexp.profile --out FILE writes one")
    writable_place(args.out, "--out")
    jobs = study_jobs(args.paths)
    if jobs.empty:
        fail(f"no finished study jobs under {', '.join(map(str, args.paths))}")
    profile = Profile.load(args.profile)
    table = reprice(jobs, profile)
    out = args.out or args.paths[0] / "reprice"
    write_repricing(table, profile, jobs, out)
    print(markdown_table(table))
    print(f"wrote {out / 'reprice.csv'}, reprice.md and reprice.pdf/png")


if __name__ == "__main__":
    main()

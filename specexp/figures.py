"""`python -m specexp.figures PATH [PATH ...] [--out DIR]`: every paper figure a sweep supports (the
command; the figures are specexp/reporting/paper_figures.py and plots.py)."""

import argparse
import sys

from specexp.cli import fail, one_line_errors, sweep_parser, writable_place
from specexp.reporting.paper_figures import make_figures

DESCRIPTION = """Every paper figure a sweep supports. Reads sweep folders (multirun/NAME) or run folders: study
jobs (summary.json + rounds.parquet) and distillation runs (result.json + metrics.jsonl). Writes each
figure as vector PDF and PNG, the headline numbers as markdown and LaTeX (booktabs), and says which
figures it skipped and why."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = sweep_parser("python -m specexp.figures", DESCRIPTION, "where figures go (default: FIRST_PATH/figures)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out = args.out or args.paths[0] / "figures"
    writable_place(out, "--out")
    made_here = not out.exists()
    with one_line_errors(FileNotFoundError):
        written, skipped = make_figures(args.paths, out)
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    if not written:
        if made_here and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # nothing half-written: no empty figures/ left behind
        fail(f"nothing to plot under {', '.join(map(str, args.paths))}: no finished study jobs or distillation runs")
    print(f"wrote {len(written)} files to {out}: {', '.join(written)}")


if __name__ == "__main__":
    main()

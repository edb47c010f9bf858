"""`python -m specexp.collect PATH [PATH ...]`: every job of one or more sweeps as one table (the
command; the table is built by specexp/reporting/job_table.py)."""

import argparse
import sys
from pathlib import Path

from specexp.cli import fail, one_line_errors, sweep_parser, writable_place
from specexp.output import markdown_table
from specexp.reporting.job_table import collect, print_table, shown_table

DESCRIPTION = """Every job of one or more sweeps as one table. One row per job folder (a folder with Hydra's
.hydra/config.yaml), a study's or a distillation's (`kind`): the flattened config (`cfg.` columns),
the Hydra choices (`choice.`), the command-line overrides (`set.`), the metrics (a study's
summary.json; a distillation's result.json and its best validation) and a status: ok, failed or
skipped (error.json, with the error; skipped: a pair whose draft does not apply to its target) or
incomplete (killed or still running). Writes PATH/collected.parquet and collected.csv (the analysis
notebooks' input), prints a compact comparison table and, with --markdown FILE, writes it as
markdown too."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = sweep_parser("python -m specexp.collect", DESCRIPTION, "output stem (default: FIRST_PATH/collected)")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the printed table as markdown here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    writable_place(args.out, "--out")
    writable_place(args.markdown, "--markdown")
    with one_line_errors(FileNotFoundError):
        table = collect(args.paths)
    if table.empty:
        fail(f"no job folders (with .hydra/config.yaml) under {', '.join(map(str, args.paths))}")
    stem = args.out or args.paths[0] / "collected"
    table.to_parquet(stem.with_suffix(".parquet"), index=False)
    table.to_csv(stem.with_suffix(".csv"), index=False)
    print_table(table)
    if args.markdown:
        args.markdown.write_text(markdown_table(shown_table(table), digits=4))
    print(f"wrote {stem.with_suffix('.parquet')} and {stem.with_suffix('.csv')}")


if __name__ == "__main__":
    main()

"""The A/A control's record: `python -m specexp experiment=aa_control` (or any study folders), then

    python benchmarks/aa_control.py multirun/aa_control [more study folders] [--out benchmarks/aa_control.md]

For each job, `benchmarks/study_record.py`'s section (the speedup with its 95% interval, the timing
passes, the speedup by which arm ran first, the per-batch ratios of every timing) and whether 1.00
lies inside the interval. It times nothing itself: it reads what the studies measured and names the
machine it runs on, which must be the one the studies ran on. One record, one run: give it the
folders of one `experiment=aa_control` run.
"""

import argparse
from pathlib import Path

from common import report_header, write_report
from study_record import job_lines, study_jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="study folders (a sweep, or single runs)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "aa_control.md")
    args = parser.parse_args()
    lines = report_header("A/A control: the speculative arm with a draft that never proposes")
    lines += ["Both arms do identical work (one target pass per token, the shipped runtime settings); the",
              "speedup must be 1.00 within its 95% interval (a t interval on the log speedup over batches,",
              "every timing of a batch kept together; each pass times a batch A B B A, so the arm order",
              "cancels).", ""]
    for job in study_jobs(args.paths):
        lines += job_lines(job, reference=1.0)
    write_report(args.out, lines)


if __name__ == "__main__":
    main()

"""The A/A control's record: `python -m specexp experiment=aa_control` (or any study folders), then

    python benchmarks/aa_control.py multirun/aa_control [more study folders] [--out benchmarks/aa_control.md]

For each job: its speedup with the 95% interval, whether 1.00 lies inside, the timing passes, the
half-width split into timing noise and the spread between batches, the speedup by which arm ran
first, and the per-batch ratios of each pass. It times nothing itself: it reads what the studies
measured (summary.json, batches.parquet) and names the machine it runs on, which must be the one
the studies ran on.
"""

import argparse
import json
from pathlib import Path

import pandas as pd
from common import report_header, write_report

from specexp.study.intervals import fmt_interval, paired_timings


def number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def job_lines(job: Path) -> list[str]:
    summary = json.loads((job / "summary.json").read_text())
    paired = paired_timings(pd.read_parquet(job / "batches.parquet"))
    paired["ratio"] = (paired["tokens_spec"] / paired["total_s_spec"]) / (paired["tokens_ar"] / paired["total_s_ar"])
    interval = summary["speedup_ci95"]
    inside = "no interval" if interval is None else "inside" if interval[0] <= 1.0 <= interval[1] else "**outside**"
    timing = summary.get("timing", {})
    first = summary.get("speedup_by_first_arm") or {}
    lines = [f"## {job.name}", "",
             f"- draft {summary['draft']}, mean K {summary['mean_k']:.2f}, greedy identical {summary['greedy_match']}, "
             f"predicted speedup {summary['predicted_speedup']}",
             f"- **speedup {fmt_interval(summary['speedup'], interval, note=summary['interval_notes'].get('speedup'))}**: "
             f"1.00 {inside} the interval",
             f"- timing passes {timing.get('passes')} ({timing.get('stopped')}; {timing.get('pilot_passes')} pilot), "
             f"{timing.get('timings_per_batch')} timings of each arm per batch; half-width "
             f"{number(timing.get('speedup_halfwidth'))}, timing noise alone {number(timing.get('noise_halfwidth'))}, "
             f"between batches {number(timing.get('between_batch_halfwidth'))}",
             "- speedup by the arm that ran first: " + ", ".join(f"{arm} first {v:.3f}" for arm, v in first.items()),
             "", "| batch | " + " | ".join(f"timing {r + 1}" for r in sorted(paired["repeat"].unique())) + " |",
             "|---|" + "---|" * paired["repeat"].nunique()]
    for batch, rows in paired.groupby("batch"):
        cells = [f"{ratio:.3f} ({first[0]})" for ratio, first in zip(rows.sort_values("repeat")["ratio"],
                                                                      rows.sort_values("repeat")["first"], strict=True)]
        lines.append(f"| {batch} | " + " | ".join(cells) + " |")
    return lines + ["", "(per-batch ratio: spec tokens/s over AR tokens/s; in brackets the arm that ran first)", ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="study folders (a sweep, or single runs)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "aa_control.md")
    args = parser.parse_args()
    jobs = sorted({summary.parent for path in args.paths for summary in path.rglob("summary.json")})
    lines = report_header("A/A control: the speculative arm with a draft that never proposes")
    lines += ["Both arms do identical work (one target pass per token, the shipped runtime settings); the",
              "speedup must be 1.00 within its 95% interval (a t interval on the log speedup over batches,",
              "every timing of a batch kept together; each pass times a batch A B B A, so the arm order",
              "cancels).", ""]
    for job in jobs:
        lines += job_lines(job)
    write_report(args.out, lines)


if __name__ == "__main__":
    main()

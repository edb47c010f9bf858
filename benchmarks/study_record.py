"""The record of one or more finished studies, written from what they measured:

    python benchmarks/study_record.py STUDY_FOLDER [...] --title TITLE --out RECORD.md

`bash experiments/default_study.sh` runs the default study as shipped and writes
benchmarks/default_study.md with it.

For each job: its command-line overrides, alpha, tau and speedup with their 95% intervals (or why
there is none), the cost model's prediction, the timing passes and the half-width split into timing
noise and the spread between batches, the speedup by which arm ran first, and the per-batch ratios of
every timing. It times nothing itself: it reads summary.json and batches.parquet and names the machine
it runs on, which must be the one the studies ran on. `benchmarks/aa_control.py` writes the A/A
control's record with these lines.
"""

import argparse
import json
from pathlib import Path

import pandas as pd
from common import report_header, write_report
from omegaconf import OmegaConf

from specexp.study.intervals import fmt_interval, paired_timings
from specexp.study.summary import k_max_of


def number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def overrides(job: Path) -> str:
    path = job / ".hydra" / "overrides.yaml"
    return " ".join(str(o) for o in OmegaConf.load(path)) if path.is_file() else ""


def job_lines(job: Path, reference: float | None = None) -> list[str]:
    """A job's section; ``reference``: a speedup the interval should cover (the A/A control's 1.00)."""
    summary = json.loads((job / "summary.json").read_text())
    notes = summary.get("interval_notes") or {}
    paired = paired_timings(pd.read_parquet(job / "batches.parquet"))
    paired["ratio"] = (paired["tokens_spec"] / paired["total_s_spec"]) / (paired["tokens_ar"] / paired["total_s_ar"])
    interval = summary["speedup_ci95"]
    timing = summary.get("timing", {})
    first = summary.get("speedup_by_first_arm") or {}
    units = summary.get("interval_units") or {}
    speedup = f"**speedup {fmt_interval(summary['speedup'], interval, note=notes.get('speedup'))}**"
    if reference is not None:
        inside = ("no interval" if interval is None else "inside" if interval[0] <= reference <= interval[1]
                  else "**outside**")
        speedup += f": {reference:.2f} {inside} the interval"
    lines = [f"## {job.name}", "", f"- overrides: `{overrides(job) or '(none)'}`",
             f"- draft {summary['draft']}, K {k_max_of(summary)} ({summary['k_policy']}), "
             f"mean K {summary['mean_k']:.2f}, "
             f"greedy identical {summary['greedy_match']}, {units.get('prompts')} prompts in "
             f"{units.get('batches')} batches",
             f"- {speedup}; predicted {number(summary.get('predicted_speedup'))}",
             f"- alpha {fmt_interval(summary['alpha'], summary.get('alpha_ci95'), note=notes.get('alpha'))}, "
             f"tau {fmt_interval(summary['tau'], summary.get('tau_ci95'), note=notes.get('tau'))}, "
             f"c {number(summary.get('cost_ratio_c'))}, tokens/s spec {number(summary['tokens_per_s_spec'])}, "
             f"AR {number(summary['tokens_per_s_ar'])}",
             f"- timing passes {timing.get('passes')} ({timing.get('stopped')}; {timing.get('pilot_passes')} pilot), "
             f"{timing.get('timings_per_batch')} timings of each arm per batch; half-width "
             f"{number(timing.get('speedup_halfwidth'))}, timing noise alone {number(timing.get('noise_halfwidth'))}, "
             f"between batches {number(timing.get('between_batch_halfwidth'))}",
             "- speedup by the arm that ran first: " + ", ".join(f"{arm} first {v:.3f}" for arm, v in first.items()),
             *runtime_lines(summary.get("runtime") or {}),
             "", "| batch | " + " | ".join(f"timing {r + 1}" for r in sorted(paired["repeat"].unique())) + " |",
             "|---|" + "---|" * paired["repeat"].nunique()]
    for batch, rows in paired.groupby("batch"):
        ordered = rows.sort_values("repeat")
        cells = [f"{ratio:.3f} ({arm[0]})" for ratio, arm in zip(ordered["ratio"], ordered["first"], strict=True)]
        lines.append(f"| {batch} | " + " | ".join(cells) + " |")
    return lines + ["", "(per-batch ratio: spec tokens/s over AR tokens/s; in brackets the arm that ran first)", ""]


def runtime_lines(runtime: dict) -> list[str]:
    """runtime.compile=true: its mode and backend, the passes that ran compiled per role, graphs compiled while
    timing."""
    if not runtime.get("compile"):
        return []
    return [f"- runtime {runtime.get('name')}, compiled ({runtime.get('compile_mode')}, "
            f"{runtime.get('compile_backend')}): "
            f"compiled passes {runtime.get('compiled_passes')}, graphs compiled while timing "
            f"{runtime.get('graphs_compiled_while_timing')}, cudagraph skips {runtime.get('cudagraph_skips')}"]


def study_jobs(paths: list[Path]) -> list[Path]:
    return sorted({summary.parent for path in paths for summary in path.rglob("summary.json")})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="study folders (a sweep, or single runs)")
    parser.add_argument("--title", default="Studies with intervals")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    lines = report_header(args.title)
    for job in study_jobs(args.paths):
        lines += job_lines(job)
    write_report(args.out, lines)


if __name__ == "__main__":
    main()

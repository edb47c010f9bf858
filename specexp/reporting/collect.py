"""`python -m specexp.collect PATH [PATH ...]`: every job of one or more sweeps as one table.

One row per job folder (a folder with Hydra's .hydra/config.yaml): the flattened config
(`cfg.` columns), the metrics of summary.json, and a status: ok, failed (error.json, with
the error) or incomplete (killed or still running). Writes PATH/collected.parquet and
collected.csv (the analysis notebooks' input) and prints a compact comparison table.
"""

import argparse
import json
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from specexp.cli import fail, one_line_errors
from specexp.study.intervals import INTERVAL_METRICS, column_interval, fmt_interval, interval_columns

METRICS = ("alpha", "drafted_acceptance_rate", "tau", "tokens_per_s_spec", "tokens_per_s_ar", "speedup", "cost_ratio_c",
           "verify_cost_ratio", "mean_k", "k_policy", "predicted_speedup", "realized_over_predicted",
           "predicted_speedup_iid", "predicted_tokens_per_round", "profile", "greedy_match", "n_prompts",
           "accepted_per_pass", "nodes_per_pass")
SHOWN = ("job", "status", "alpha", "tau", "speedup", "predicted_speedup", "realized_over_predicted", "cost_ratio_c")


def job_row(job_dir: Path, root: Path) -> dict:
    config = OmegaConf.to_container(OmegaConf.load(job_dir / ".hydra" / "config.yaml"), resolve=False)
    overrides = OmegaConf.load(job_dir / ".hydra" / "overrides.yaml") if (job_dir / ".hydra" / "overrides.yaml").exists() else []
    row = {"job": str(job_dir.relative_to(root)) if job_dir != root else job_dir.name, "path": str(job_dir),
           "overrides": " ".join(str(o) for o in overrides)}
    row.update({f"cfg.{k}": v for k, v in pd.json_normalize(config, sep=".").iloc[0].items()})
    choices_file = job_dir / ".hydra" / "hydra.yaml"
    if choices_file.exists():
        choices = OmegaConf.load(choices_file).hydra.runtime.choices
        row.update({f"choice.{k}": v for k, v in choices.items() if not str(k).startswith("hydra")})
    if (job_dir / "summary.json").exists():
        summary = json.loads((job_dir / "summary.json").read_text())
        row["status"] = summary.get("status", "ok")
        row.update({m: summary.get(m) for m in METRICS})
        row["k_max"] = summary.get("k")  # the K a fixed-K job ran, the most a K policy could choose
        row.update(interval_columns(summary))  # 95% intervals as two columns each
        row["timing_passes"] = (summary.get("timing") or {}).get("passes")
        curve_ci = summary.get("acceptance_curve_ci95") or []
        for i, a in enumerate(summary.get("acceptance_curve") or [], start=1):
            row[f"acceptance_pos{i}"] = a
            lo, hi = (curve_ci[i - 1] if i <= len(curve_ci) else None) or (None, None)
            row[f"acceptance_pos{i}_ci95_lo"], row[f"acceptance_pos{i}_ci95_hi"] = lo, hi
        for cat, values in (summary.get("per_category") or {}).items():
            row.update({f"{m}.{cat}": v for m, v in values.items()})
        row.update({f"time_split.{k}": v for k, v in (summary.get("time_split") or {}).items()})
    elif (job_dir / "error.json").exists():
        error = json.loads((job_dir / "error.json").read_text())
        row["status"], row["error"] = "failed", error.get("error")
    else:
        row["status"] = "incomplete"
    return row


def collect(paths: list[Path]) -> pd.DataFrame:
    rows = []
    for root in paths:
        if not root.exists():
            raise FileNotFoundError(f"'{root}' does not exist")
        for config in sorted(root.rglob(".hydra/config.yaml")):
            rows.append(job_row(config.parent.parent, root))
    table = pd.DataFrame(rows)
    # A column of mixed types (draft.k: 1, 2, ..., "auto") is written as strings: parquet wants one type.
    for column in table.columns[table.dtypes.map(lambda dtype: dtype == "object")]:
        kinds = {type(v) for v in table[column].dropna()}
        if str in kinds and len(kinds) > 1:
            table[column] = table[column].map(lambda v: v if v is None or v != v else str(v))
    return table


def cell(row: pd.Series, column: str) -> str:
    """A table cell: a metric with its 95% interval where the job has one ('1.120 [1.050, 1.190]')."""
    value = row[column]
    if column in INTERVAL_METRICS and isinstance(value, float) and value == value:
        return fmt_interval(value, column_interval(row, column))
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def print_table(table: pd.DataFrame, console: Console | None = None) -> None:
    view = Table(title=f"{len(table)} jobs")
    columns = [c for c in SHOWN if c in table.columns]
    for column in columns:
        view.add_column(column, justify="left" if column in ("job", "status") else "right", overflow="fold")
    for _, row in table.iterrows():
        view.add_row(*[cell(row, c) for c in columns])
    (console or Console()).print(view)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specexp.collect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="sweep folders (multirun/NAME) or run folders")
    parser.add_argument("--out", type=Path, default=None, help="output stem (default: FIRST_PATH/collected)")
    args = parser.parse_args(argv)
    with one_line_errors(FileNotFoundError):
        table = collect(args.paths)
    if table.empty:
        fail(f"no job folders (with .hydra/config.yaml) under {', '.join(map(str, args.paths))}")
    stem = args.out or args.paths[0] / "collected"
    table.to_parquet(stem.with_suffix(".parquet"), index=False)
    table.to_csv(stem.with_suffix(".csv"), index=False)
    print_table(table)
    print(f"wrote {stem.with_suffix('.parquet')} and {stem.with_suffix('.csv')}")


if __name__ == "__main__":
    main()

"""The job table: one row per job folder of one or more sweeps (what `python -m specexp.collect`
writes and prints, and the analysis notebooks read).

A job folder is one with Hydra's .hydra/config.yaml, a study's or a distillation's (`kind`). Its row
holds the flattened config (`cfg.` columns), the Hydra choices (`choice.`), the command-line
overrides (`set.`), the metrics (a study's summary.json; a distillation's result.json and its best
validation) and a status: ok, failed or skipped (error.json, with the error; skipped: a pair whose
draft does not apply to its target) or incomplete (killed or still running).
"""

import json
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from specexp.drafts.registry import TESTS_ONLY
from specexp.study.intervals import column_interval, fmt_interval
from specexp.study.summary import interval_columns, k_max_of, keys

METRICS = keys(collected=True)  # a study's summary fields that are columns (specexp.study.summary)
DISTILL_METRICS = ("best_alpha", "steps", "parameters", "draft_vocab_size", "corpus_tokens")
SHOWN = ("job", "status", "alpha", "tau", "speedup", "predicted_speedup", "realized_over_predicted", "cost_ratio_c")


def overrides_of(job_dir: Path) -> dict[str, str]:
    """The job's own command-line overrides (key -> value), without Hydra's and the experiment's."""
    path = job_dir / ".hydra" / "overrides.yaml"
    overrides = OmegaConf.load(path) if path.exists() else []
    return dict(str(o).split("=", 1) for o in overrides
                if "=" in str(o) and not str(o).startswith(("hydra.", "experiment=")))


def validation_history(job_dir: Path) -> list[dict]:
    """A distillation's validations in order (metrics.jsonl: one JSON object per line)."""
    path = job_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def study_metrics(summary: dict) -> dict:
    row = {"kind": "study", "status": summary.get("status", "ok")} | {m: summary.get(m) for m in METRICS}
    row["k_max"] = k_max_of(summary)
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
    return row


def distill_metrics(result: dict, history: list[dict]) -> dict:
    """A finished distillation: its result and the greedy match of its best validation."""
    best = max(history, key=lambda v: v.get("val/alpha", float("-inf")), default={})
    return {"kind": "distill", "status": "ok", "greedy_match": best.get("val/greedy_match")} | \
        {m: result.get(m) for m in DISTILL_METRICS}


def job_row(job_dir: Path, root: Path) -> dict:
    config = OmegaConf.to_container(OmegaConf.load(job_dir / ".hydra" / "config.yaml"), resolve=False)
    overrides = overrides_of(job_dir)
    row = {"job": str(job_dir.relative_to(root)) if job_dir != root else job_dir.name, "path": str(job_dir),
           "overrides": " ".join(f"{k}={v}" for k, v in overrides.items())}
    row.update({f"cfg.{k}": v for k, v in pd.json_normalize(config, sep=".").iloc[0].items()
                if not k.startswith(f"draft.{TESTS_ONLY}")})
    choices_file = job_dir / ".hydra" / "hydra.yaml"
    if choices_file.exists():
        choices = OmegaConf.load(choices_file).hydra.runtime.choices
        row.update({f"choice.{k}": v for k, v in choices.items() if not str(k).startswith("hydra")})
    row.update({f"set.{k}": v for k, v in overrides.items()})
    if (job_dir / "summary.json").exists():
        row.update(study_metrics(json.loads((job_dir / "summary.json").read_text())))
    elif (job_dir / "result.json").exists():
        row.update(distill_metrics(json.loads((job_dir / "result.json").read_text()), validation_history(job_dir)))
    elif (job_dir / "error.json").exists():
        error = json.loads((job_dir / "error.json").read_text())
        row["status"], row["error"] = error.get("status", "failed"), error.get("error")
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


def distillation_table(table: pd.DataFrame) -> pd.DataFrame:
    """The distillation jobs: their overrides and results, best held-out alpha first."""
    runs = table[table["kind"] == "distill"]
    varied = [c for c in runs.columns if c.startswith("set.") and runs[c].notna().any()]
    view = runs[varied + ["best_alpha", "greedy_match", *DISTILL_METRICS[1:]]]
    return view.rename(columns={c: c.removeprefix("set.") for c in varied}).sort_values("best_alpha", ascending=False)


def shown_table(table: pd.DataFrame) -> pd.DataFrame:
    """What is printed: the study jobs' headline columns (a metric with its interval in one cell) or,
    for a sweep of distillations only, their table."""
    kinds = table["kind"] if "kind" in table else pd.Series(None, index=table.index, dtype=object)
    if (kinds == "distill").all():
        return distillation_table(table)
    studies = table[kinds != "distill"]
    columns = [c for c in SHOWN if c in studies.columns]
    return pd.DataFrame([[cell(row, c) for c in columns] for _, row in studies.iterrows()], columns=columns)


def cell(row: pd.Series, column: str) -> str:
    """A table cell: a metric with its 95% interval where the job has one ('1.120 [1.050, 1.190]')."""
    value = row[column]
    if column in keys(interval=True) and isinstance(value, float) and value == value:
        note = row.get(f"{column}_ci95_note")
        return fmt_interval(value, column_interval(row, column), note=note if isinstance(note, str) else None)
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def print_table(table: pd.DataFrame, console: Console | None = None) -> None:
    shown = shown_table(table)
    view = Table(title=f"{len(table)} jobs")
    for column in shown.columns:
        view.add_column(column, justify="left" if column in ("job", "status") else "right", overflow="fold")
    for row in shown.itertuples(index=False):
        view.add_row(*(f"{v:.4f}" if isinstance(v, float) else str(v) for v in row))
    (console or Console()).print(view)

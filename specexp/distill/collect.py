"""Distillation runs -> one table: `python -m specexp.distill.collect PATH [--markdown FILE]`.

A row per run folder under PATH (a multirun or a single run): its overrides, the best held-out
alpha and greedy match, and the run's size; `history` keeps every validation (for figures).
"""

import argparse
import json
from pathlib import Path

import pandas as pd
import yaml
from rich.console import Console
from rich.table import Table

from specexp.output import markdown_table


def read_run(folder: Path) -> dict | None:
    """One finished run (a result.json), or None."""
    result_file = folder / "result.json"
    if not result_file.is_file():
        return None
    result = json.loads(result_file.read_text())
    overrides_file = folder / ".hydra" / "overrides.yaml"
    overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.is_file() else []
    history = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()] \
        if (folder / "metrics.jsonl").is_file() else []
    best = max(history, key=lambda row: row.get("val/alpha", float("-inf")), default={})
    row = {"run": str(folder)}
    row |= dict(o.split("=", 1) for o in overrides if "=" in o and not o.startswith(("hydra.", "experiment=")))
    row |= {"best_alpha": result.get("best_alpha"), "greedy_match": best.get("val/greedy_match"),
            "steps": result.get("steps"), "parameters": result.get("parameters"),
            "draft_vocab_size": result.get("draft_vocab_size"), "corpus_tokens": result.get("corpus_tokens"),
            "history": history}
    return row


def collect(path: str | Path) -> pd.DataFrame:
    runs = [read_run(f.parent) for f in sorted(Path(path).rglob("result.json"))]
    return pd.DataFrame([r for r in runs if r is not None])


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """The table without paths and histories, best run first."""
    return table.drop(columns=["run", "history"]).sort_values("best_alpha", ascending=False)


def markdown(table: pd.DataFrame) -> str:
    return markdown_table(shown(table), digits=4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path")
    parser.add_argument("--markdown", type=Path, help="also write the table as markdown here")
    args = parser.parse_args()
    table = collect(args.path)
    if table.empty:
        raise SystemExit(f"error: no finished distillation runs (result.json) under '{args.path}'")
    table.drop(columns=["history"]).to_csv(Path(args.path) / "collected.csv", index=False)
    rich_table = Table(title=f"distillation runs in {args.path}")
    view = shown(table)
    for column in view.columns:
        rich_table.add_column(column)
    for row in view.itertuples(index=False):
        rich_table.add_row(*(f"{v:.4f}" if isinstance(v, float) else str(v) for v in row))
    Console().print(rich_table)
    if args.markdown:
        args.markdown.write_text(markdown(table))


if __name__ == "__main__":
    main()

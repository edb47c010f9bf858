"""The table and ranking `python -m specexp.pairing` writes from the predictions (study/pairing_prediction.py)."""

from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from specexp.errors import UserInputError

SHOWN = ("target", "draft", "data", "temperature", "best_k", "mean_k", "predicted_alpha", "predicted_tau",
         "predicted_speedup")


def ranking(table: pd.DataFrame) -> pd.DataFrame:
    """Each pair at its best K, the drafts of each target from the fastest predicted down."""
    best = table[table["is_best_k"]].copy()
    best["rank"] = best.groupby(["target", "data", "temperature"])["predicted_speedup"].rank(ascending=False,
                                                                                              method="first")
    return best.sort_values(["target", "data", "temperature", "rank"]).reset_index(drop=True)


def write_predictions(rows: list[dict], out: Path) -> pd.DataFrame:
    if not rows:
        raise UserInputError("no (target, draft) pair applied: nothing was predicted")
    table = pd.DataFrame(rows)
    out.mkdir(parents=True, exist_ok=True)
    table.to_parquet(out / "pairing.parquet", index=False)
    table.to_csv(out / "pairing.csv", index=False)
    ranked = ranking(table)
    view = Table(title="predicted at each pair's best K (ranked per target)")
    for column in ("rank", *SHOWN):
        view.add_column(column, justify="left" if column in ("target", "draft", "data") else "right")
    for row in ranked.itertuples():
        view.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v)
                       for v in (int(row.rank), *(getattr(row, c) for c in SHOWN))))
    Console(width=160).print(view)
    print(f"predictions: {out / 'pairing.parquet'}")
    return table


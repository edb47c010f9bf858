"""Acceptance predicted before decoding against the study that measures it (issue 33).

  python benchmarks/pairing.py [--prompts 8] [--max-new-tokens 64]
                               [--settings mt_bench:greedy,spec_bench:greedy,mt_bench:nucleus,spec_bench:nucleus]
                               [--out benchmarks/pairing.md]

For each (target, draft) pair below, in one process: `python -m specexp.pairing`'s prediction (the
target's continuations, the draft replayed along them, every K priced with this machine's profile)
and then the study itself (`python -m specexp target=T draft=D` at the same prompts, sampling and
size, draft.k=auto as the study's default, 30 s of extra timing passes as the sweeps), with the wall
time of each, at each setting (data:sampling; nucleus is T = 0.7). Per cell: predicted and measured
alpha and speedup, the measured 95% intervals, and whether the prediction is a hit (inside the
interval); per target and setting: the drafts ranked by predicted and by measured speedup.
"""

import argparse
import tempfile
import time
from pathlib import Path

import pandas as pd
from common import report_header, write_report
from hydra import compose, initialize_config_dir

from specexp.cli import CONFIG_DIR
from specexp.reporting.pairing import predict_pair
from specexp.study.run import run_from_config

PAIRS = {"default": ["prompt_lookup", "target_prefix", "early_exit", "distilled", "eagle", "medusa"],
         "gemma3_270m": ["prompt_lookup", "target_prefix", "early_exit", "smollm2_135m"]}


def fmt(value) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:.3f}"


def inside(value, interval) -> str:
    if value is None or not interval or interval[0] is None:
        return "-"
    return "hit" if interval[0] <= value <= interval[1] else "miss"


def cell(target: str, draft: str, overrides: list[str]) -> dict:
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[f"target={target}", f"draft={draft}", *overrides])
    started = time.perf_counter()
    predicted = next(row for row in predict_pair(cfg, target, draft) if row["is_best_k"])
    predict_s = time.perf_counter() - started
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        measured = run_from_config(cfg, Path(out))
    study_s = time.perf_counter() - started
    return {"target": target, "draft": draft, "best_k": predicted["best_k"],
            "predicted_alpha": predicted["predicted_alpha"], "alpha": measured["alpha"],
            "alpha_ci95": measured.get("alpha_ci95"), "predicted_speedup": predicted["predicted_speedup"],
            "speedup": measured["speedup"], "speedup_ci95": measured.get("speedup_ci95"),
            "mean_k": measured.get("mean_k"), "predict_s": predict_s, "study_s": study_s}


def setting_report(data: str, sampling: str, args) -> tuple[list[str], pd.DataFrame]:
    """One setting's cells (a table) and each target's two rankings."""
    overrides = [f"data={data}", f"data.limit={args.prompts}", f"max_new_tokens={args.max_new_tokens}",
                 f"sampling={sampling}", "timing.budget_s=30"]  # the sweeps' timing budget
    cells = [cell(target, draft, overrides) for target, drafts in PAIRS.items() for draft in drafts]
    rows = ["| target | draft | best K (pred) | alpha pred | alpha measured [95%] | alpha | speedup pred | "
            "speedup measured [95%] | speedup | predict s | study s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        a_lo, a_hi = c["alpha_ci95"] or (None, None)
        s_lo, s_hi = c["speedup_ci95"] or (None, None)
        c["hit"] = inside(c["predicted_speedup"], c["speedup_ci95"])
        rows.append(f"| {c['target']} | {c['draft']} | {c['best_k']} | {fmt(c['predicted_alpha'])} | {fmt(c['alpha'])} "
                    f"[{fmt(a_lo)}, {fmt(a_hi)}] | {inside(c['predicted_alpha'], c['alpha_ci95'])} | "
                    f"{fmt(c['predicted_speedup'])} | {fmt(c['speedup'])} [{fmt(s_lo)}, {fmt(s_hi)}] | "
                    f"{c['hit']} | {c['predict_s']:.0f} | {c['study_s']:.0f} |")
    table = pd.DataFrame(cells)
    ranks = ["| target | by predicted speedup | by measured speedup |", "|---|---|---|"]
    for target, group in table.groupby("target", sort=False):
        by_pred = " > ".join(group.sort_values("predicted_speedup", ascending=False)["draft"])
        by_meas = " > ".join(group.sort_values("speedup", ascending=False)["draft"])
        ranks.append(f"| {target} | {by_pred} | {by_meas} |")
    hits = (table["hit"] == "hit").sum()
    lines = [f"## {data}, sampling={sampling}", "", *rows, "",
             f"Speedup hits: {hits} of {len(table)}; predict {table['predict_s'].sum():.0f} s, "
             f"study {table['study_s'].sum():.0f} s in all.", "", *ranks, ""]
    return lines, table.assign(data=data, sampling=sampling)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--settings", default="mt_bench:greedy,spec_bench:greedy,mt_bench:nucleus,spec_bench:nucleus",
                        help="data:sampling pairs, comma-separated")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "pairing.md")
    args = parser.parse_args()
    sections, tables = [], []
    for setting in args.settings.split(","):  # the report is rewritten after each setting: a kill loses one
        data, sampling = setting.split(":")
        lines, table = setting_report(data, sampling, args)
        sections += lines
        tables.append(table)
        every = pd.concat(tables)
        write_report(args.out, [
            *report_header("Acceptance predicted before decoding, against the study"),
            f"{args.prompts} prompts x {args.max_new_tokens} tokens per setting, batch 1, the study at draft.k=auto "
            "as its default; the prediction at its best K (0..k_max; 0: AR). 'hit': inside the measured 95% interval. "
            f"Speedup hits over the settings below: {(every['hit'] == 'hit').sum()} of {len(every)}.", "", *sections])


if __name__ == "__main__":
    main()

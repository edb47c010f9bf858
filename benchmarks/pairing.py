"""Acceptance predicted before decoding against the study that measures it, like for like (issues 33, 49).

  python benchmarks/pairing.py [--prompts 8] [--max-new-tokens 64]
                               [--settings mt_bench:greedy,spec_bench:greedy,mt_bench:nucleus,spec_bench:nucleus]
                               [--targets default,gemma3_270m] [--budget-s 30]
                               [--out benchmarks/pairing.md]

For each (target, draft) pair below, in one process: `python -m specexp.pairing`'s prediction (the
target's continuations, the draft replayed along them, every K priced with this machine's profile,
each with a 95% interval over prompts) and then the study itself (`python -m specexp target=T
draft=D` at the same prompts, sampling and size) at the K the prediction chose (at K = 1 where it
chose 0, not drafting, and then the prediction's K = 1 row is the one compared), 30 s of extra timing
passes as the sweeps, with the wall time of each, at each setting (data:sampling; nucleus is
T = 0.7). Per cell: the K and the tokens verified per round on both sides, predicted and measured
alpha and speedup with their 95% intervals, whether the prediction is a hit (inside the measured
interval), and study seconds over predict seconds (the predictor should be >= 3x faster); per
target and setting: the drafts ranked by predicted and by measured speedup.
"""

import argparse
import tempfile
import time
from pathlib import Path

import pandas as pd
from common import report_header, write_report
from hydra import compose, initialize_config_dir

from specexp.paths import CONFIG_DIR
from specexp.study.pairing_prediction import predict_pair
from specexp.study.run import prepare, run_from_config

PAIRS = {"default": ["prompt_lookup", "target_prefix", "early_exit", "distilled", "eagle", "medusa"],
         "gemma3_270m": ["prompt_lookup", "target_prefix", "early_exit", "smollm2_135m"]}


def fmt(value) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:.3f}"


def fmt_interval(interval) -> str:
    lo, hi = interval or (None, None)
    return f"[{fmt(lo)}, {fmt(hi)}]"


def inside(value, interval) -> str:
    if value is None or not interval or interval[0] is None:
        return "-"
    return "hit" if interval[0] <= value <= interval[1] else "miss"


def cell(target: str, draft: str, overrides: list[str]) -> dict:
    """One pair: the prediction over every K, then the study at the K it chose (1 where it chose 0)."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[f"target={target}", f"draft={draft}", *overrides])
    prepare(cfg)  # untimed: this machine's profile of the pair, measured once and cached, serves both sides
    started = time.perf_counter()
    rows = predict_pair(cfg, target, draft)
    predict_s = time.perf_counter() - started
    best_k = rows[0]["best_k"]
    compared = next(row for row in rows if row["k"] == max(best_k, 1))  # the study needs a draft to run
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[f"target={target}", f"draft={draft}", *overrides,
                                           f"draft.k={compared['k']}"])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        measured = run_from_config(cfg, Path(out))
    study_s = time.perf_counter() - started
    return {"target": target, "draft": draft, "best_k": best_k, "k": compared["k"], "study_k": measured["k_max"],
            "predicted_verified": compared["mean_k"], "verified": measured["nodes_per_pass"],
            "predicted_alpha": compared["predicted_alpha"], "alpha": measured["alpha"],
            "alpha_ci95": measured.get("alpha_ci95"), "predicted_speedup": compared["predicted_speedup"],
            "predicted_speedup_ci95": compared.get("predicted_speedup_ci95"),
            "speedup": measured["speedup"], "speedup_ci95": measured.get("speedup_ci95"),
            "notes": measured.get("interval_notes") or {}, "predict_s": predict_s, "study_s": study_s}


def setting_report(data: str, sampling: str, cells: list[dict]) -> tuple[list[str], pd.DataFrame]:
    """One setting's cells (a table) and each target's two rankings."""
    rows = ["| target | draft | best K (pred) | K (pred / study) | verified per round (pred / study) | alpha pred | "
            "alpha measured [95%] | alpha | speedup pred [95%] | speedup measured [95%] | speedup | predict s | "
            "study s | study / predict |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        c["alpha_hit"] = inside(c["predicted_alpha"], c["alpha_ci95"])
        c["hit"] = inside(c["predicted_speedup"], c["speedup_ci95"])
        rows.append(f"| {c['target']} | {c['draft']} | {c['best_k']} | {c['k']} / {c['study_k']} | "
                    f"{fmt(c['predicted_verified'])} / {fmt(c['verified'])} | {fmt(c['predicted_alpha'])} | "
                    f"{fmt(c['alpha'])} {fmt_interval(c['alpha_ci95'])} | {c['alpha_hit']} | "
                    f"{fmt(c['predicted_speedup'])} {fmt_interval(c['predicted_speedup_ci95'])} | "
                    f"{fmt(c['speedup'])} {fmt_interval(c['speedup_ci95'])} | {c['hit']} | {c['predict_s']:.0f} | "
                    f"{c['study_s']:.0f} | {c['study_s'] / c['predict_s']:.1f} |")
    table = pd.DataFrame(cells)
    ranks = ["| target | by predicted speedup | by measured speedup |", "|---|---|---|"]
    for target, group in table.groupby("target", sort=False):
        by_pred = " > ".join(group.sort_values("predicted_speedup", ascending=False)["draft"])
        by_meas = " > ".join(group.sort_values("speedup", ascending=False)["draft"])
        ranks.append(f"| {target} | {by_pred} | {by_meas} |")
    slow = table[table["study_s"] < 3 * table["predict_s"]]
    notes = [f"- {c['target']} / {c['draft']}: {key}: {why}" for c in cells for key, why in c["notes"].items()]
    lines = [f"## {data}, sampling={sampling}", "", *rows, "",
             f"Hits: alpha {(table['alpha_hit'] == 'hit').sum()} of {(table['alpha_hit'] != '-').sum()} judged, "
             f"speedup {(table['hit'] == 'hit').sum()} of {len(table)}; predict {table['predict_s'].sum():.0f} s, "
             f"study {table['study_s'].sum():.0f} s in all. Predictor under 3x faster than the study: "
             f"{', '.join(slow['target'] + '/' + slow['draft']) or 'none'}.", "", *ranks, "",
             *(["Intervals not given:", *notes, ""] if notes else [])]
    return lines, table.assign(data=data, sampling=sampling)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--settings", default="mt_bench:greedy,spec_bench:greedy,mt_bench:nucleus,spec_bench:nucleus",
                        help="data:sampling pairs, comma-separated")
    parser.add_argument("--targets", default=",".join(PAIRS), help="targets of PAIRS, comma-separated")
    parser.add_argument("--budget-s", type=float, default=30.0, help="each study's seconds of extra timing passes")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "pairing.md")
    args = parser.parse_args()
    done: list[tuple[str, str, list[dict]]] = []  # per setting: its data, sampling and cells so far
    for setting in args.settings.split(","):
        data, sampling = setting.split(":")
        overrides = [f"data={data}", f"data.limit={args.prompts}", f"max_new_tokens={args.max_new_tokens}",
                     f"sampling={sampling}", f"timing.budget_s={args.budget_s}"]  # 30: the sweeps' timing budget
        done.append((data, sampling, []))
        for target in args.targets.split(","):
            for draft in PAIRS[target]:  # the record is rewritten after each pair: a kill loses one
                done[-1][2].append(cell(target, draft, overrides))
                write(args, done)


def write(args, done: list[tuple[str, str, list[dict]]]) -> None:
    sections, tables = [], []
    for data, sampling, cells in done:
        lines, table = setting_report(data, sampling, cells)
        sections += lines
        tables.append(table)
    every = pd.concat(tables)
    write_report(args.out, [
        *report_header("Acceptance predicted before decoding, against the study"),
        f"{args.prompts} prompts x {args.max_new_tokens} tokens per setting, batch 1; the prediction's best K "
        "(0..k_max; 0: AR) and the study at that K (1 where it is 0; the prediction's K = 1 row compared). "
        "'hit': the prediction inside the measured 95% interval. "
        f"Speedup hits over the settings below: {(every['hit'] == 'hit').sum()} of {len(every)}.", "", *sections])

if __name__ == "__main__":
    main()

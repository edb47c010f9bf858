"""The logger a job reports to (`logger=`): nothing (`none`), or W&B (`wandb`: a run with its history rows, tables
and plots). The job's own files are study/results.py's."""

import logging
import os
from pathlib import Path

import pandas as pd

from specexp.study.divergence import steps_apart
from specexp.study.summary import interval_columns, keys

log = logging.getLogger(__name__)


class NullTracker:
    """logger=none: tracks nothing."""

    def __init__(self, config: dict | None = None):
        pass

    def log_run(self, summary: dict, rounds: pd.DataFrame, answers: list[dict]) -> None:
        pass

    def finish(self, failed: bool = False) -> None:
        pass


def wandb_mode(mode: str) -> str:
    """'auto': online when an API key is configured (env or netrc), else offline (`wandb sync` later)."""
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    netrc = Path.home() / ".netrc"
    has_key = bool(os.environ.get("WANDB_API_KEY")) or (netrc.exists() and "api.wandb.ai" in netrc.read_text())
    return "online" if has_key else "offline"


HEADLINE_KEYS = keys(headline=True)  # the history row at x = k (specexp.study.summary)


def divergence_columns(divergence: dict | None) -> list:
    """A sample's first divergence (greedy arms that differ) and its logit gap in rounding steps."""
    if not divergence:
        return [None, None]
    return [divergence["position"], steps_apart(divergence)]


def interval_keys(summary: dict) -> dict:
    """The headline numbers' 95% intervals as scalar keys W&B can chart: `speedup_ci95_lo`, `_hi`, ..."""
    return {key: value for key, value in interval_columns(summary).items() if value is not None}


class WandbTracker:
    """logger=wandb. Every call is failure-safe: W&B trouble is a warning, never a lost or failed job."""

    def __init__(self, config: dict, project: str = "specexp", entity: str | None = None, mode: str = "auto",
                 group: str | None = None, job_type: str | None = None, tags: list[str] | None = None,
                 name: str | None = None, dir: str | None = None, max_table_rows: int = 1000,
                 choices: dict | None = None):
        """choices: the config-group options of the job (draft, data, ...), kept in the run's config
        as `choice.GROUP` so tables and filters can name them."""
        self.max_table_rows = max_table_rows
        config = {**config, "choice": dict(choices)} if choices else config
        self.run = None
        try:
            import wandb

            self.wandb = wandb
            if dir:
                Path(dir).mkdir(parents=True, exist_ok=True)
            self.run = wandb.init(project=project, entity=entity, mode=wandb_mode(mode), group=group, job_type=job_type,
                                  tags=[str(t) for t in tags or []], name=name, dir=dir, config=config,
                                  settings=wandb.Settings(init_timeout=60, silent=True))
        except Exception as error:  # no network, bad key, unwritable folder: results stay local
            log.warning("W&B disabled for this run: %s", error)

    def log_run(self, summary: dict, rounds: pd.DataFrame, answers: list[dict]) -> None:
        if self.run is None:
            return
        try:
            wandb = self.wandb
            self.run.summary.update({k: v for k, v in summary.items() if not isinstance(v, (list, dict))})
            self.run.summary.update(interval_keys(summary))
            self.run.summary["time_split"] = summary.get("time_split")
            curve_ci = summary.get("acceptance_curve_ci95") or [None] * len(summary["acceptance_curve"])
            curve = wandb.Table(columns=["position", "acceptance", "acceptance_ci95_lo", "acceptance_ci95_hi"],
                                data=[[i + 1, a, *(ci or (None, None))] for i, (a, ci) in
                                      enumerate(zip(summary["acceptance_curve"], curve_ci, strict=False))
                                      if a is not None])
            lengths = wandb.Table(columns=["accepted", "rounds"],
                                  data=[[n, count] for n, count in
                                        enumerate(summary.get("accepted_length_histogram", []))])
            per_category = wandb.Table(columns=["category", "alpha", "tau", "speedup"], data=[
                [cat, v["alpha"], v["tau"], v["speedup"]] for cat, v in (summary.get("per_category") or {}).items()])
            sample = rounds.sample(min(len(rounds), self.max_table_rows), random_state=0) if len(rounds) else rounds
            texts = [[a["prompt_id"], a["category"], a["spec_text"], a["ar_text"], a["identical"],
                      *divergence_columns(a.get("divergence"))] for a in answers]
            # History rows that let panels draw lines across runs (specexp.reporting.workspace): one with the
            # headline numbers at x = k_max, then one per draft position at x = position.
            self.run.log({"k_max": summary["k_max"],
                          **{key: summary[key] for key in HEADLINE_KEYS if summary.get(key) is not None},
                          **interval_keys(summary)})
            for position, acceptance, lo, hi in curve.data:
                self.run.log({"position": position, "acceptance": acceptance,
                              **({"acceptance_ci95_lo": lo, "acceptance_ci95_hi": hi} if lo is not None else {})})
            self.run.log({
                "acceptance_curve": curve,
                "acceptance_curve_plot": wandb.plot.line(curve, "position", "acceptance",
                                                         title="P(accept position i | earlier accepted)"),
                "accepted_lengths": lengths,
                "accepted_length_plot": wandb.plot.bar(lengths, "accepted", "rounds",
                                                       title="rounds by draft tokens accepted (a tree's: path depth)"),
                "per_category": per_category,
                "speedup_per_category": wandb.plot.bar(per_category, "category", "speedup",
                                                       title="speedup per category"),
                "rounds_sample": wandb.Table(dataframe=sample),
                "samples": wandb.Table(columns=["prompt_id", "category", "spec_text", "ar_text", "identical",
                                                "first_divergence", "gap_rounding_steps"],
                                       data=texts[: self.max_table_rows]),
            })
        except Exception as error:
            log.warning("W&B logging failed (local results are complete): %s", error)

    def finish(self, failed: bool = False) -> None:
        if self.run is None:
            return
        try:
            self.run.finish(exit_code=1 if failed else 0)
        except Exception as error:
            log.warning("W&B finish failed (local results are complete): %s", error)

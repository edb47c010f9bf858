"""Where results go: local files always (atomic writes), W&B when logger=wandb."""

import json
import logging
import os
from pathlib import Path

import pandas as pd

log = logging.getLogger(__name__)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class LocalResults:
    """A run's folder: answers.jsonl grows per batch; summary.json and rounds.parquet land at the end."""

    def __init__(self, out_dir: Path):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.answers_path = self.out_dir / "answers.jsonl"
        self.answers_path.write_text("")

    def write_config(self, config_yaml: str) -> None:
        write_atomic(self.out_dir / "config.yaml", config_yaml.encode())

    def add_answers(self, rows: list[dict]) -> None:
        with self.answers_path.open("a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
            f.flush()

    def finish(self, summary: dict, rounds: pd.DataFrame) -> None:
        tmp = self.out_dir / "rounds.parquet.tmp"
        rounds.to_parquet(tmp, index=False)
        os.replace(tmp, self.out_dir / "rounds.parquet")
        # summary.json last: its presence marks a complete run.
        write_atomic(self.out_dir / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())


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


class WandbTracker:
    """logger=wandb. Every call is failure-safe: W&B trouble is a warning, never a lost or failed job."""

    def __init__(self, config: dict, project: str = "specexp", entity: str | None = None, mode: str = "auto",
                 group: str | None = None, job_type: str | None = None, tags: list[str] | None = None,
                 name: str | None = None, dir: str | None = None, max_table_rows: int = 1000):
        self.max_table_rows = max_table_rows
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
            self.run.summary["time_split"] = summary.get("time_split")
            curve = wandb.Table(columns=["position", "acceptance"],
                                data=[[i + 1, a] for i, a in enumerate(summary["acceptance_curve"]) if a is not None])
            per_category = wandb.Table(columns=["category", "alpha", "tau", "speedup"], data=[
                [cat, v["alpha"], v["tau"], v["speedup"]] for cat, v in (summary.get("per_category") or {}).items()])
            sample = rounds.sample(min(len(rounds), self.max_table_rows), random_state=0) if len(rounds) else rounds
            texts = [[a["prompt_id"], a["category"], a["spec_text"], a["ar_text"], a["identical"]] for a in answers]
            self.run.log({
                "acceptance_curve": curve,
                "acceptance_curve_plot": wandb.plot.line(curve, "position", "acceptance",
                                                         title="P(accept position i | earlier accepted)"),
                "per_category": per_category,
                "speedup_per_category": wandb.plot.bar(per_category, "category", "speedup", title="speedup per category"),
                "rounds_sample": wandb.Table(dataframe=sample),
                "samples": wandb.Table(columns=["prompt_id", "category", "spec_text", "ar_text", "identical"],
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

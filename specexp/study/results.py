"""A job's local results: its folder's files, written as they complete (staged, then moved in, so a crash
loses at most the job in flight), a finished job found again, a failed one's error recorded."""

import json
import os
import shutil
import traceback
from pathlib import Path

import pandas as pd

from specexp.output import write_atomic

RESULT_FILES = ("config.yaml", "answers.jsonl", "rounds.parquet", "batches.parquet", "profile.json", "summary.json",
                "error.json")


class JobResults:
    """One job's folder. Results are staged in ``.partial/`` and moved in when the job
    completes, summary.json last, so a killed job leaves no partial results and a
    summary.json means a complete run of the config whose hash it records."""

    def __init__(self, out_dir: Path, config_hash: str):
        self.out_dir = Path(out_dir)
        self.config_hash = config_hash
        self.staging = self.out_dir / ".partial"

    def completed_summary(self) -> dict | None:
        """The summary of a finished run of this same config, if there is one."""
        path = self.out_dir / "summary.json"
        if not path.exists():
            return None
        summary = json.loads(path.read_text())
        return summary if summary.get("config_hash") == self.config_hash else None

    def begin(self, config_yaml: str) -> None:
        for name in RESULT_FILES:  # a rerun replaces whatever an earlier run left
            (self.out_dir / name).unlink(missing_ok=True)
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True)
        (self.staging / "config.yaml").write_text(config_yaml)
        (self.staging / "answers.jsonl").write_text("")

    def add_answers(self, rows: list[dict]) -> None:
        """Append one batch's answers as it completes."""
        with (self.staging / "answers.jsonl").open("a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)

    def finish(self, summary: dict, rounds: pd.DataFrame, batches: pd.DataFrame | None = None,
               profile: dict | None = None) -> None:
        """Move the job's files in, summary.json last. ``batches``: one row per (mode, batch);
        ``profile``: the hardware profile the run was priced with (so the folder re-prices alone)."""
        rounds.to_parquet(self.staging / "rounds.parquet", index=False)
        names = ["config.yaml", "answers.jsonl", "rounds.parquet"]
        if batches is not None:
            batches.to_parquet(self.staging / "batches.parquet", index=False)
            names.append("batches.parquet")
        if profile is not None:
            (self.staging / "profile.json").write_text(json.dumps(profile, indent=1) + "\n")
            names.append("profile.json")
        for name in names:
            os.replace(self.staging / name, self.out_dir / name)
        summary = {**summary, "status": "ok", "config_hash": self.config_hash}
        write_atomic(self.out_dir / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())
        shutil.rmtree(self.staging, ignore_errors=True)

    def record_failure(self, error: BaseException, status: str = "failed") -> None:
        """error.json: why the job ended without results (status "skipped": a pair that does not apply)."""
        shutil.rmtree(self.staging, ignore_errors=True)
        record = {"status": status, "error": f"{type(error).__name__}: {error}", "config_hash": self.config_hash,
                  "traceback": "".join(traceback.format_exception(error))}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.out_dir / "error.json", (json.dumps(record, indent=2) + "\n").encode())

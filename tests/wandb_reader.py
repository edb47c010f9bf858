"""Read an offline W&B run back without a server: its .wandb log through wandb's own protobuf
schema (a LevelDB-style log: 7-byte header, 32 KiB blocks of crc32/length/type records)."""

import json
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

HEADER, BLOCK, RECORD_HEADER = 7, 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list:
    data, pos, parts, out = path.read_bytes(), HEADER, b"", []
    while pos + RECORD_HEADER <= len(data):
        if BLOCK - pos % BLOCK < RECORD_HEADER:  # block trailer padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + RECORD_HEADER])
        chunk = data[pos + RECORD_HEADER : pos + RECORD_HEADER + length]
        pos += RECORD_HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts + chunk if kind == LAST else chunk)
            out.append(record)
            parts = b""
        elif kind in (FIRST, MIDDLE):
            parts += chunk
    return out


def offline_run(run_dir: Path) -> dict:
    """{'finished': bool, 'summary': {...}, 'config': {...}, 'history': [{...} per logged row], 'tags': [...],
    'group': str, 'job_type': str, 'tables': {key: table json}}."""
    (log,) = run_dir.glob("run-*.wandb")
    summary, config, history, run, finished = {}, {}, [], None, False
    for record in records(log):
        kind = record.WhichOneof("record_type")
        finished |= kind == "exit"  # written once the run's finish() has gone through
        if kind == "history":
            history.append({"/".join(item.nested_key) or item.key: json.loads(item.value_json)
                            for item in record.history.item})
        elif kind == "summary":
            for item in record.summary.update:
                summary["/".join(item.nested_key) or item.key] = json.loads(item.value_json)
        elif kind == "run":  # the config given to wandb.init rides on the run record
            run = record.run
            for item in run.config.update:
                config[item.key] = json.loads(item.value_json)
    tables = {}
    for key, value in summary.items():
        if key.endswith("/path") and str(value).endswith(".table.json"):
            tables[key[: -len("/path")]] = json.loads((run_dir / "files" / value).read_text())
    # Lightning's WandbLogger can leave the run record out of the offline log; then only the
    # summary and config are known (callers that need group/tags assert on them).
    return {"finished": finished, "summary": summary, "config": config, "history": history,
            "tags": list(run.tags) if run else None, "group": run.run_group if run else None,
            "job_type": run.job_type if run else None, "tables": tables}

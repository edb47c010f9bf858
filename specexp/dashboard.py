"""`python -m specexp.dashboard --project P [--entity E] [--group STUDY]`: a saved W&B workspace that
compares drafts (the command; the workspace is specexp/reporting/workspace.py)."""

import argparse
import os
import sys

from specexp.cli import CommandParser
from specexp.reporting import workspace
from specexp.reporting.workspace import build_workspace, describe
from specexp.study.tracking import wandb_mode

DESCRIPTION = f"""{workspace.__doc__.strip()}

Without an API key (or with --dry-run) it prints what it would save and exits 0."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = CommandParser(prog="python -m specexp.dashboard", description=DESCRIPTION,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", required=True, help="the W&B project the studies log to (logger.project)")
    parser.add_argument("--entity", default=None, help="W&B entity (default: your default entity)")
    parser.add_argument("--group", default=None, help="only this study's runs (its experiment_name, e.g. k_sweep)")
    parser.add_argument("--name", default=None, help="the saved workspace's name")
    parser.add_argument("--dry-run", action="store_true", help="print what would be saved; save nothing")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    online = wandb_mode("auto") == "online" and not args.dry_run
    entity = args.entity
    if online and entity is None:
        try:
            import wandb

            entity = wandb.Api().default_entity
        except Exception as error:  # no network or a bad key: say so and save nothing
            print(f"not saved: could not reach W&B to find your entity ({str(error).splitlines()[0]}); "
                  f"pass --entity or check the network")
            online = False
    workspace = build_workspace(args.project, entity or "<your-entity>", args.group, args.name)
    print(describe(workspace))
    if not online:
        reason = "--dry-run" if args.dry_run else "no W&B API key (set WANDB_API_KEY or run `wandb login`)"
        print(f"not saved: {reason}; run again online to save it")
        return
    try:
        workspace.save()
    except Exception as error:
        print(f"not saved: W&B refused or could not be reached ({str(error).splitlines()[0]})")
        return
    print(f"saved: {workspace.url}")


if __name__ == "__main__":
    os.environ.setdefault("WANDB_SILENT", "true")
    main()

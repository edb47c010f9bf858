"""`python -m specexp.pairing`: which draft for which target, predicted before decoding (the command;
the replay is specexp/study/replay.py, the pricing costs/cost_model.round_yields and price_rounds)."""

import argparse
import sys
from pathlib import Path

from specexp.cli import CommandParser

DESCRIPTION = """For each target x draft, on a study's prompts and sampling (OVERRIDES: the same Hydra config groups
and overrides as `python -m specexp`: data=, sampling=, data.limit=, max_new_tokens=, ...): the target
writes its continuation of every prompt once, each draft is replayed along it with no target pass
(greedy: the study's own rounds; sampled: exact in expectation at every depth), and every K from 0
(not drafting) to the draft's k_max is priced with this machine's hardware profile of the target
(measured once and cached, as a study does) or --profile FILE's. Prints the table and each target's
ranking of its drafts by predicted speedup at their best K; writes DIR/pairing.parquet and pairing.csv.
A draft that does not apply to a target is skipped with one line."""


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The command's options, and the Hydra overrides that follow them."""
    parser = CommandParser(prog="python -m specexp.pairing", description=DESCRIPTION,
                           usage="%(prog)s [--targets A,B] [--drafts X,Y] [--profile FILE] [--out DIR] [OVERRIDES ...]",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default="default", help="target configs, comma-separated (default: default)")
    parser.add_argument("--drafts", default=None, help="draft configs, comma-separated (default: the drafts whose YAML "
                        "card says pairing: true: prompt_lookup, target_prefix, distilled, eagle, medusa)")
    parser.add_argument("--profile", default=None, help="price with this profile JSON instead of this machine's")
    parser.add_argument("--out", default="outputs/pairing", help="folder of pairing.parquet and pairing.csv "
                        "(default: outputs/pairing)")
    options, overrides = parser.parse_known_args(argv)
    if unknown := [a for a in overrides if a.startswith("--")]:
        parser.error(f"unrecognized option {unknown[0]}")
    return options, overrides


def main(argv: list[str] | None = None) -> None:
    """`python -m specexp.pairing [options] [overrides]` (DESCRIPTION)."""
    from specexp.cli import fail, one_line_errors, user_error
    from specexp.configs import compose_checked, unknown_choice
    from specexp.drafts.registry import pairing_drafts
    from specexp.errors import DraftDoesNotApply
    from specexp.reporting.ranking import write_predictions
    from specexp.study.pairing_prediction import predict_pair

    options, args = parse_args(list(sys.argv[1:] if argv is None else argv))
    targets = options.targets.split(",")
    drafts = options.drafts.split(",") if options.drafts else pairing_drafts()
    profile, out = options.profile, Path(options.out)
    if profile is not None and not Path(profile).is_file():
        fail(f"--profile {profile} does not exist; give a profile JSON (python -m specexp.profile --out FILE)")
    if (message := unknown_choice([*args, *(f"target={t}" for t in targets), *(f"draft={d}" for d in drafts)])):
        fail(message)
    rows = []
    for target in targets:
        for draft in drafts:
            overrides = [*args, f"target={target}", f"draft={draft}"] + ([f"profile.path={profile}"] if profile else [])
            with one_line_errors():
                cfg = compose_checked("config", overrides, "python -m specexp.pairing")
                try:
                    rows += predict_pair(cfg, target, draft)
                except Exception as exc:
                    if not isinstance(user_error(exc), DraftDoesNotApply):
                        raise
                    print(f"[skipped] target={target} draft={draft}: {user_error(exc)}")
    with one_line_errors():
        write_predictions(rows, out)


if __name__ == "__main__":
    main()

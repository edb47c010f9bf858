"""`python -m specexp.pairing`: which draft for which target, predicted before decoding (the command;
the replay is specexp/study/replay.py, the pricing costs/cost_model.round_yields and price_rounds)."""

import sys
from pathlib import Path

USAGE = """usage: python -m specexp.pairing [--targets A,B,...] [--drafts X,Y,...] [--profile FILE] [--out DIR]
                                 [OVERRIDES ...]

For each target x draft, on a study's prompts and sampling (the same Hydra config groups and
overrides as `python -m specexp`: data=, sampling=, data.limit=, max_new_tokens=, ...): the target
writes its continuation of every prompt once, each draft is replayed along it with no target pass
(greedy: the study's own rounds; sampled: exact in expectation at every depth), and every K from 0
(not drafting) to the draft's k_max is priced with this machine's hardware profile of the target (measured once
and cached, as a study does) or --profile FILE's. Prints the table and each target's ranking of
its drafts by predicted speedup at their best K; writes DIR/pairing.parquet and pairing.csv
(default DIR: outputs/pairing). A draft that does not apply to a target is skipped with one line.
Defaults: --targets default, --drafts prompt_lookup,target_prefix,distilled,eagle,medusa."""

DEFAULT_DRAFTS = "prompt_lookup,target_prefix,distilled,eagle,medusa"


def option(args: list[str], name: str, default: str | None) -> str | None:
    """Pop ``name VALUE`` from args (one-line error when the value is missing)."""
    from specexp.cli import fail

    if name not in args:
        return default
    i = args.index(name)
    if i + 1 >= len(args):
        fail(f"{name} needs a value (python -m specexp.pairing --help)")
    value = args.pop(i + 1)
    args.pop(i)
    return value


def main(argv: list[str] | None = None) -> None:
    """`python -m specexp.pairing [options] [overrides]` (USAGE)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from specexp.cli import CONFIG_DIR, fail, one_line_errors, unknown_choice, user_error
    from specexp.errors import DraftDoesNotApply
    from specexp.reporting.pairing import predict_pair, write_predictions

    args = list(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(args):
        print(USAGE)
        return
    targets = option(args, "--targets", "default").split(",")
    drafts = option(args, "--drafts", DEFAULT_DRAFTS).split(",")
    profile = option(args, "--profile", None)
    out = Path(option(args, "--out", "outputs/pairing"))
    if profile is not None and not Path(profile).is_file():
        fail(f"--profile {profile} does not exist; give a profile JSON (python -m specexp.profile --out FILE)")
    if (message := unknown_choice([*args, *(f"target={t}" for t in targets), *(f"draft={d}" for d in drafts)])):
        fail(message)
    rows = []
    for target in targets:
        for draft in drafts:
            overrides = [*args, f"target={target}", f"draft={draft}"] + ([f"profile.path={profile}"] if profile else [])
            try:
                with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
                    cfg = compose("config", overrides=overrides)
            except HydraException as error:
                fail(f"{str(error).splitlines()[0]} (python -m specexp.pairing --help)")
            with one_line_errors():
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

"""The Hydra configs a command composes (conf/config.yaml for a study, conf/distill.yaml for distillation),
checked before anything runs or is written: an option with no file, an experiment or group of another
command, an unknown key, a malformed override or a required value left unset becomes one UserInputError
line naming the value and what is allowed. Also each command's own groups, experiments and --help page."""

import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from specexp.cli import fail
from specexp.errors import UserInputError
from specexp.paths import CONFIG_DIR

COMMANDS = {"config": "python -m specexp", "distill": "python -m specexp.distill"}  # primary config -> command
HELP_FLAGS = ("--help", "-h", "--hydra-help", "--info", "--shell-completion", "-sc")
NOT_OPTIONS = ("_self_",)


def user_config_dirs(args: list[str]) -> list[str]:
    """Config folders a user adds on the command line, the Hydra way: ``--config-dir DIR`` / ``-cd DIR``
    and ``hydra.searchpath=[file://DIR, ...]`` (their groups are searched too)."""
    dirs = []
    for i, arg in enumerate(args):
        if arg in ("--config-dir", "-cd") and i + 1 < len(args):
            dirs.append(args[i + 1])
        elif arg.startswith("--config-dir="):
            dirs.append(arg.partition("=")[2])
        elif arg.lstrip("+").startswith("hydra.searchpath="):
            entries = arg.partition("=")[2].strip("[]").split(",")
            paths = [e.strip().strip("'\"") for e in entries]
            dirs += [p.removeprefix("file://") for p in paths if p.startswith(("file://", "/", "."))]
    return dirs


def defaults_groups(path: Path) -> list[str]:
    """The groups a config file's defaults list names (``- draft: x``, ``- override /draft: x``)."""
    defaults = OmegaConf.to_container(OmegaConf.load(path)).get("defaults") or []
    entries = [next(iter(d)) for d in defaults if isinstance(d, dict)]
    return [e.removeprefix("override").strip().lstrip("/").partition("@")[0] for e in entries]


def command_groups(config_name: str) -> list[str]:
    """The groups a command composes: its primary config's defaults list, in order."""
    return [g for g in defaults_groups(Path(CONFIG_DIR) / f"{config_name}.yaml") if g not in NOT_OPTIONS]


def group_options(group: str, config_dirs: tuple[str, ...] = ()) -> list[str]:
    """The options of a group: its YAML files in conf/ and in the user's config folders."""
    return sorted({f.stem for root in (CONFIG_DIR, *config_dirs) for f in (Path(root) / group).glob("*.yaml")})


def experiment_command(name: str, config_dirs: tuple[str, ...] = ()) -> str | None:
    """The primary config an experiment belongs to: the first whose groups hold every group it overrides."""
    paths = [Path(root) / "experiment" / f"{name}.yaml" for root in (*config_dirs, CONFIG_DIR)]
    path = next((p for p in paths if p.is_file()), None)
    if path is None:
        return None
    overridden = set(defaults_groups(path))
    return next((config for config in COMMANDS if overridden <= set(command_groups(config))), None)


def command_experiments(config_name: str, config_dirs: tuple[str, ...] = ()) -> list[str]:
    """The experiments a command runs (conf/experiment/*.yaml that compose with its primary config)."""
    return [e for e in group_options("experiment", config_dirs) if experiment_command(e, config_dirs) == config_name]


def unknown_choice(args: list[str], config_name: str = "config",
                   config_dirs: tuple[str, ...] | None = None) -> str | None:
    """One-line error for a ``group=option`` override naming an option that has no config file, an
    experiment of another command, or a group the command does not compose.

    Hydra reports the same over a dozen lines; this names the bad value and the allowed ones.
    Sweep expressions (``choice(...)``, ``range(...)``) are left to Hydra. ``config_dirs``: the user's config
    folders (default: those the overrides add through hydra.searchpath).
    """
    config_dirs = tuple(user_config_dirs(args)) if config_dirs is None else config_dirs
    command, groups = COMMANDS.get(config_name, config_name), command_groups(config_name)
    for arg in args:
        group, sep, value = arg.partition("=")
        appended = group.startswith("+")
        group = group.lstrip("+")
        if not sep or "(" in value or not any((Path(root) / group).is_dir() for root in (CONFIG_DIR, *config_dirs)):
            continue
        if group not in groups and not appended:
            return f"'{group}' is not a config group of {command}; its groups: {', '.join(groups)}"
        allowed = command_experiments(config_name, config_dirs) if group == "experiment" else group_options(
            group, config_dirs)
        for option in value.split(","):
            if option in allowed or option == "null":
                continue
            if group == "experiment" and (owner := experiment_command(option, config_dirs)) is not None:
                return (f"experiment '{option}' is {COMMANDS[owner]}'s, not {command}'s; {command}'s experiments: "
                        f"{', '.join(allowed)}")
            return f"unknown {group} '{option}'; allowed: {', '.join(allowed)}"
    return None


def missing_value(cfg: DictConfig, choices: dict, config_dir: str = CONFIG_DIR) -> str | None:
    """One-line error for a required value (``???``) left unset, naming the key, the option that
    needs it and what it takes (the comment on its line in that option's file)."""
    for key in sorted(OmegaConf.missing_keys(cfg)):
        group, _, name = key.partition(".")
        option = choices.get(group)
        line = ""
        if option is not None and (path := Path(config_dir) / group / f"{option}.yaml").is_file():
            line = next((ln for ln in path.read_text().splitlines() if ln.startswith(f"{name}:")), "")
        takes = line.partition("#")[2].strip()
        needed_by = f" by {group}={option}" if option else ""
        return f"{key} is required{needed_by} and has no value; give {key}=VALUE" + (f" ({takes})" if takes else "")
    return None


def first_of_sweeps(overrides: list[str]) -> list[str]:
    """A multirun's overrides with each sweep (a,b / choice / range / glob) at its first value: the job whose
    keys stand for all the others'. An interval sweep (a sweeper's search space) is left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    first = []
    for override in OverridesParser.create().parse_overrides(overrides):
        if not override.is_sweep_override():
            first.append(override.input_line)
        elif not override.is_interval_sweep():
            first.append(f"{override.get_key_element()}={next(override.sweep_string_iterator())}")
    return first


def compose(config_name: str, overrides: list[str], config_dirs: tuple[str, ...] = (),
            with_hydra: bool = False) -> DictConfig:
    """The composed config for these overrides (``with_hydra``: with Hydra's own node, `hydra.runtime.choices`
    among it); a Hydra error raised as it is."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    if config_dirs:  # a --config-dir is searched as hydra.searchpath is
        searched = [o for o in overrides if o.lstrip("+").startswith("hydra.searchpath=")]
        entries = [e for o in searched for e in o.partition("=")[2].strip("[]").split(",") if e.strip()]
        entries += [f"file://{Path(d).resolve()}" for d in config_dirs if not any(d in e for e in entries)]
        overrides = [o for o in overrides if o not in searched] + [f"hydra.searchpath=[{','.join(entries)}]"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return hydra_compose(config_name, overrides=overrides, return_hydra_config=with_hydra)


def compose_error(error: Exception, config_name: str, overrides: list[str], config_dirs: tuple[str, ...],
                  command: str | None = None) -> str:
    """Hydra's composition error as one line naming the bad key and what the config takes there; ``command``
    is the one whose --help the line points at (default: the primary config's)."""
    command = command or COMMANDS.get(config_name, config_name)
    message = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    if (found := re.search(r"Could not override '([^']+)'\. To append", message)) is not None:
        key = found.group(1)
        kept = [o for o in overrides if o.lstrip("+~").partition("=")[0] != key]
        try:
            cfg = compose(config_name, kept, config_dirs, with_hydra=True)
        except Exception:  # another override is bad too: Hydra's words for the first
            return f"{message} ({command} --help)"
        parent, _, _ = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if not isinstance(node, DictConfig):
            return f"unknown key '{key}': {parent} is a value, not a section ({command} --help)"
        choices = cfg.hydra.runtime.choices
        keys = [k for k in node if not str(k).startswith("_") and k not in ("card", "hydra")]
        if not parent:
            keys = [k for k in keys if k not in command_groups(config_name)]
        where = f"{parent}={choices[parent]}" if parent in choices else (parent or command)
        return f"unknown key '{key}'; {where} has: {', '.join(map(str, keys))} (a new key: +{key}=VALUE)"
    if (found := re.search(r"Could not override '([^']+)'\. No match in the defaults list", message)) is not None:
        groups = ", ".join(command_groups(config_name))
        return f"'{found.group(1)}' is not a config group of {command}; its groups: {groups}"
    return f"{message} ({command} --help)"


def hydra_arguments(argv: list[str]):
    """Hydra's own reading of a command line: its flags and the overrides."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser().parse_args(argv)


def check_command_line(config_name: str, argv: list[str]) -> tuple[DictConfig, bool] | None:
    """The command's config composed once from ``argv`` before Hydra runs it (a multirun: its first job's) and
    whether it is a multirun (-m, or a config that sets hydra.mode MULTIRUN, as an experiment may); None for a
    help or info page. A bad override raises UserInputError with one line."""
    if any(flag in argv for flag in HELP_FLAGS):
        return None
    args = hydra_arguments(argv)
    config_dirs = tuple(user_config_dirs(argv))
    if (message := unknown_choice(args.overrides, config_name, config_dirs)) is not None:
        raise UserInputError(message)
    first = first_of_sweeps(args.overrides)
    cfg = compose_checked(config_name, first, config_dirs=config_dirs, with_hydra=True)
    multirun = args.multirun or str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    if not multirun and first != args.overrides:  # a sweep in a single run: Hydra's words for it, in one line
        compose_checked(config_name, args.overrides, config_dirs=config_dirs)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, multirun


def compose_checked(config_name: str, overrides: list[str], command: str | None = None,
                    config_dirs: tuple[str, ...] | None = None, with_hydra: bool = False) -> DictConfig:
    """The composed config, or a UserInputError line for what Hydra could not compose (``command``: the
    command whose --help the line points at)."""
    from hydra.errors import HydraException

    config_dirs = tuple(user_config_dirs(overrides)) if config_dirs is None else config_dirs
    try:
        return compose(config_name, overrides, config_dirs, with_hydra)
    except HydraException as error:
        raise UserInputError(compose_error(error, config_name, overrides, config_dirs, command)) from None


def help_page(config_name: str) -> str:
    """The command's --help: its hydra.help.template with its own groups (and only its own experiments) and
    its top-level keys with their defaults."""
    config = OmegaConf.load(Path(CONFIG_DIR) / f"{config_name}.yaml")
    groups = command_groups(config_name)
    lines = [f"{group}: " + ", ".join(command_experiments(config_name) if group == "experiment"
                                      else group_options(group)) for group in groups]
    plain = OmegaConf.to_container(config, resolve=False)
    keys = [f"{key}={'{...}' if isinstance(value, dict) else yaml_value(value)}"
            for key, value in plain.items() if key not in ("defaults", "hydra", *groups)]
    template = str(config.hydra.help.template)
    listing = "\n".join(lines) + ("\n\nTop-level keys (key=default; a section's keys: section.key=VALUE, "
                                  "--cfg job shows all):\n")
    listing += "\n".join(wrap(" ".join(keys)))
    return template.replace("$APP_CONFIG_GROUPS", listing + "\n")


def yaml_value(value) -> str:
    """A scalar as a YAML override writes it (null, true, 0.5, text)."""
    return OmegaConf.to_yaml(OmegaConf.create({"v": value})).strip().removeprefix("v:").strip()


def wrap(text: str, width: int = 100) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken at spaces."""
    return textwrap.wrap(text, width, break_on_hyphens=False)


def answer_help(config_name: str, argv: list[str]) -> None:
    """`--help` / `-h`: print the command's own page and exit 0 (Hydra's --hydra-help stays Hydra's)."""
    if "--help" in argv or "-h" in argv:
        print(help_page(config_name))
        sys.exit(0)


def unset_keys(cfg: DictConfig) -> list[str]:
    """The keys whose value is required and unset (``???``), read without resolving interpolations (Hydra's own
    resolve only inside a running app)."""
    def walk(node, prefix: str) -> list[str]:
        if isinstance(node, dict):
            return [key for name, value in node.items() for key in walk(value, f"{prefix}{name}.")]
        return [prefix.rstrip(".")] if node == "???" else []

    return walk(OmegaConf.to_container(cfg, resolve=False), "")


def check_before_hydra(config_name: str, argv: list[str], check_values: Callable[[DictConfig], None]) -> None:
    """A command's --help answered, and bad overrides (in a single run also bad values, by ``check_values``)
    ended in one line, before Hydra writes a run folder."""
    answer_help(config_name, argv)
    try:
        composed = check_command_line(config_name, argv)
        # a required value left unset is answered by the command itself, before its imports
        if composed is not None and not composed[1] and not unset_keys(composed[0]):
            check_values(composed[0])
    except UserInputError as error:
        fail(error)

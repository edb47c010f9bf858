"""Where specexp's own files are: the Hydra configs it composes and the cache it writes (models it
assembled, corpora, profiles, plans)."""

import os
from pathlib import Path


def find_config_dir() -> str:
    """The Hydra configs: the top-level conf/ of a source checkout (and an editable install), or the
    copy a wheel or non-editable install carries inside the package (setup.py's build_py)."""
    packaged = Path(__file__).resolve().parent / "conf"
    return str(packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "conf")


CONFIG_DIR = find_config_dir()


def cache_root() -> Path:
    """$SPECEXP_CACHE, else ~/.cache/specexp."""
    return Path(os.environ.get("SPECEXP_CACHE", Path.home() / ".cache" / "specexp"))

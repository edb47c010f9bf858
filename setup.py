"""Build step pyproject.toml cannot state: wheels and non-editable installs carry the top-level conf/
(the design card's Hydra configs, kept there as the one source) inside the package as specexp/conf,
so `python -m specexp` composes from any install. Everything else is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithConfigs(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:  # an editable install reads conf/ in the checkout (specexp/paths.py)
            shutil.copytree(Path(__file__).resolve().parent / "conf", Path(self.build_lib) / "specexp" / "conf",
                            dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildPyWithConfigs})

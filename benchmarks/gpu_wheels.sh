#!/usr/bin/env bash
# Before a lent GPU's call (`device` tool): the Python packages its image lacks or holds too old
# (transformers < 5.24 ignores the cache keyword; hydra, datasets, gguf, ... are missing), as cp312
# wheels of the versions installed here, into .whl/ (git-ignored) for `carry`. gpu_check.sh installs
# them there. The call's tree must stay under 64 MiB: move specexp/assets/ (the shipped drafts, which
# no step of gpu_check.sh needs) out of the work tree for the call and `git checkout specexp/assets` after.
#   bash benchmarks/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES="transformers huggingface_hub httpx2 httpcore2 truststore kernels tomlkit tokenizers hydra-core omegaconf
antlr4-python3-runtime datasets dill multiprocess gguf pydivsufsort"
PLATFORMS="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
--platform manylinux2014_x86_64 --platform manylinux1_x86_64"
rm -rf .whl && mkdir .whl
for name in $PACKAGES; do
  version=$(python -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
  [ -n "$version" ] || { echo "error: $name is not installed here; install the project first" >&2; exit 2; }
  # shellcheck disable=SC2086
  python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLATFORMS \
    -d .whl "$name==$version" 2>/dev/null \
    || python -m pip wheel -q --no-deps -w .whl "$name==$version"  # a pure-Python sdist: built here
done
du -sh .whl

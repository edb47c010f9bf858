#!/usr/bin/env bash
# specexp's EAGLE-3 against vllm-project/speculators 0.7.0 (benchmarks/speculators_check.py): builds
# speculators' venv once (its pinned transformers < 5.15 and the CPU torch; torchvision / torchaudio are
# not needed to build, save or load a head) under ~/.cache/specexp, then writes benchmarks/speculators_check.md.
#   bash benchmarks/speculators_check.sh
set -euo pipefail
cd "$(dirname "$0")"
venv="${SPECULATORS_VENV:-$HOME/.cache/specexp/speculators-0.7.0-venv}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import speculators" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q torch==2.13.0 "transformers>=5.14,<5.15"
  "$venv/bin/python" -m pip install -q --no-deps speculators==0.7.0
  "$venv/bin/python" -m pip install -q pydantic pydantic-settings "loguru>=0.7.2,<=0.7.3" click typer rich safetensors \
    "tqdm>=4.66.3,<=4.70.0" huggingface-hub "datasets<=5" psutil protobuf openai
fi
python speculators_check.py --speculators-python "$venv/bin/python"

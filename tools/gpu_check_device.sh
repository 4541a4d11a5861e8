#!/usr/bin/env bash
# The device check on a lent GPU machine, as one call: that machine's python3 (torch with CUDA,
# transformers, numpy 2; no vLLM, no pydantic, no Triton server, no network) runs tools/gpu_check.py
# from this checkout, nothing installed and nothing to carry. What comes back, under $OUT
# (./gpu-check-out where OUT is unset): gpu-report.json (rewritten after each part, so a run cut short
# still returns what it found), gpu-check.log (the whole stderr, ending in the summary table) and
# machine.txt (nvidia-smi, the package versions).
#
#   bash tools/gpu_check_device.sh            # on the GPU machine; a 360 s limit leaves time to rerun
#   GPU_CHECK_BUDGET_S=120 tools/gpu_check_device.sh --models qwen2.5-0.5b   # arguments go to gpu_check.py
#   PATH=$PWD/.venv-gpuprep/bin:$PATH tools/gpu_check_device.sh --cpu   # the dry run on CPU (docs/engine.md)
#
# Exit status: gpu_check's (0 every check passed, 1 a check failed, 2 no CUDA device, 3 nothing failed
# but a part was skipped: there vLLM is absent, so 3 is the best that machine gives), or 124 when the
# timeout below ended a part that ran on (the report holds every part finished before it).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-check-out}"
budget_s="${GPU_CHECK_BUDGET_S:-240}"  # no part starts after it (gpu_check's own default, 420 s, is for a
                                       # host of one's own; a lent machine has 15 minutes, its start included)
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # nothing to download; fail fast, not hang
{
    nvidia-smi || echo "nvidia-smi: not available"
    python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'
    python3 -m pip list 2>/dev/null | grep -i -E '^(torch|transformers|tokenizers|safetensors|accelerate|numpy|pydantic|vllm) '
} > "$out/machine.txt" 2>&1
# stdout carries the JSON report (also in --out): only the log and the summary table are shown here
timeout -k 15 $((budget_s + 90)) python3 tools/gpu_check.py --budget-s "$budget_s" --out "$out/gpu-report.json" "$@" \
    2>&1 >/dev/null | tee "$out/gpu-check.log"
status=${PIPESTATUS[0]}
if [ "$status" -ge 124 ] && [ -s "$out/gpu-report.json" ]; then
    echo "gpu_check_device: stopped after $((budget_s + 90)) s; the saved report so far:"
    python3 tools/gpu_check_report.py "$out/gpu-report.json"
fi
exit "$status"

#!/usr/bin/env bash
# Install TokenRouter into the base image's Python without replacing anything the image ships.
#   docker/install_project.sh PIP_ARGS...       the Dockerfile passes: -e /opt/tokenrouter
# 1. Freeze every installed distribution as a constraint (name==version), 2. pip install with
# those constraints: new packages may come from PyPI, the image's torch/vLLM/transformers stay,
# and a requirement that needs another version of them fails the build with a resolver conflict,
# 3. check that nothing frozen changed. tests/docker/test_image_install.py runs this very script
# against a fake image. PYTHON and PIP may be overridden (the test does); PIP_* options apply.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
PIP="${PIP:-$PYTHON -m pip}"
CONSTRAINTS="${CONSTRAINTS:-/opt/tokenrouter/image-constraints.txt}"
here="$(cd "$(dirname "$0")" && pwd)"
# NGC images on Ubuntu 24.04 mark the system Python as externally managed (PEP 668); this image
# is that environment's only user.
export PIP_BREAK_SYSTEM_PACKAGES=1
"$PYTHON" "$here/freeze_constraints.py" > "$CONSTRAINTS"
echo "install_project: $(wc -l < "$CONSTRAINTS") distributions of the image frozen in $CONSTRAINTS" >&2
$PIP install --no-cache-dir --constraint "$CONSTRAINTS" "$@"
"$PYTHON" "$here/freeze_constraints.py" --check "$CONSTRAINTS"

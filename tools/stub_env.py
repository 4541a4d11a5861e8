"""A Python environment for the nvidia-pytriton wheel's Python-backend stub when numpy is 2.x.

The wheel's stub (Triton 2.51) was built with a pybind11 that reads numpy 1's dtype layout: under
numpy 2 every tensor it hands to Python comes out wrong (a 9-byte BYTES input "hello" arrives as
nine copies of its first byte, and the stub aborts in ``deserialize_bytes_tensor``). The stub finds
its interpreter's prefix through ``python3`` on PATH and honours a virtual environment's
``pyvenv.cfg`` (it ignores PYTHONPATH), so the launcher gives it a small environment of its own:
numpy 1.x first, then this interpreter's site-packages with their .pth files. Only the stubs see
it; the launcher, the tests and the clients keep numpy 2.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tempfile
from pathlib import Path

STUB_NUMPY = "numpy==1.26.4"  # the last numpy 1.x; torch 2.13 and transformers 5.19 accept it


def stub_needs_numpy1(install_has_wheel_stub: bool) -> bool:
    """The bundled stub with numpy 2 in this environment: the case the stub mishandles."""
    if not install_has_wheel_stub:
        return False
    import numpy

    return int(numpy.__version__.split(".")[0]) >= 2


def ensure_stub_env(root: Path) -> Path:
    """``root``/bin, to put first on the stub's PATH; built once (atomically) and reused."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    env = root / f"{version}-{STUB_NUMPY.replace('==', '-')}"
    if (env / "pyvenv.cfg").is_file():
        return env / "bin"
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        packages = staging / "lib" / version / "site-packages"
        packages.mkdir(parents=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(packages),
                        STUB_NUMPY], check=True, stdout=subprocess.DEVNULL)
        base = Path(sys.base_prefix) / "bin"
        (staging / "pyvenv.cfg").write_text(f"home = {base}\ninclude-system-site-packages = false\n"
                                            f"version = {'.'.join(map(str, sys.version_info[:3]))}\n")
        (staging / "bin").mkdir()
        (staging / "bin" / "python3").symlink_to(Path(sys.executable).resolve())
        # after numpy 1.x: this interpreter's site-packages, .pth files (editable installs) included
        dirs = ", ".join(repr(d) for d in site.getsitepackages())
        (packages / "zz_tokenrouter_base.pth").write_text(f"import site; list(map(site.addsitedir, ({dirs},)))\n")
        try:
            os.rename(staging, env)
        except OSError:  # another launcher built it first
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return env / "bin"

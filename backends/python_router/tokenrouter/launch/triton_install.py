"""The Triton installation a launch uses, made ready for our backend: where its binary is, a backend
folder of its own in which ``backend: "python_router"`` resolves to backends/python_router/model.py, and
an environment in which the Python backend's stub imports this interpreter's packages.

A system `tritonserver` (the NGC image) is used when there is one; otherwise the binary that the
`nvidia-pytriton` wheel bundles.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from tokenrouter.openai_server.app import API_KEY_ENV
from tokenrouter.serving.pair_secret import PAIR_SECRET_ENV

from .errors import TritonError
from .paths import backend_model_file

BACKEND_MODEL_FILE = backend_model_file()
SYSTEM_TRITON_HOME = Path("/opt/tritonserver")


@dataclass(frozen=True)
class TritonInstall:
    """Where one Triton installation keeps what a launch needs."""

    binary: Path
    backends: Path  # folder of backends (python/, and on the NGC image tensorrtllm/ etc.)
    lib_dirs: tuple[Path, ...] = ()  # extra LD_LIBRARY_PATH entries (the wheel's bundled libs)
    stub: Path | None = None  # Python backend stub to add to backends/python (the wheel only)


def find_triton() -> TritonInstall:
    """A system tritonserver when present, else the nvidia-pytriton wheel's bundled one."""
    system = shutil.which("tritonserver") or (
        str(SYSTEM_TRITON_HOME / "bin" / "tritonserver")
        if (SYSTEM_TRITON_HOME / "bin" / "tritonserver").is_file()
        else None
    )
    if system:
        home = Path(system).resolve().parents[1]
        return TritonInstall(binary=Path(system), backends=home / "backends")
    # The wheel nvidia-pytriton: only its files are used, not its API, and it is installed without
    # its dependencies (tools/install.sh), so locate the package without importing it.
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonError(
            "no tritonserver found: install Triton (the NGC image has it) or "
            "`pip install --no-deps nvidia-pytriton==0.7.0`"
        )
    package = Path(list(spec.submodule_search_locations)[0]).resolve()
    home = package / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = home / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise TritonError(f"the nvidia-pytriton wheel has no Python backend stub for Python {version}")
    libs = package.parent / "nvidia_pytriton.libs"
    return TritonInstall(binary=home / "bin" / "tritonserver", backends=home / "backends", lib_dirs=(libs,), stub=stub)


def build_backend_dir(install: TritonInstall, dest: Path, model_file: Path | None = BACKEND_MODEL_FILE) -> Path:
    """Make ``dest`` a backend directory: the installation's backends plus python_router.

    The stub is copied (not linked) because the Python backend looks for it next to
    libtriton_python.so in the folder Triton loaded the library from.
    """
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for backend in sorted(install.backends.iterdir()):
        if backend.name == "python_router" or not backend.is_dir():
            continue
        if backend.name == "python" and install.stub is not None:
            shutil.copytree(backend, dest / "python", ignore=shutil.ignore_patterns("__pycache__"))
            shutil.copy2(install.stub, dest / "python" / install.stub.name)
        else:
            (dest / backend.name).symlink_to(backend.resolve(), target_is_directory=True)
    if model_file is not None:
        if not model_file.is_file():
            raise TritonError(f"the python_router backend is missing: {model_file} does not exist")
        (dest / "python_router").mkdir()
        (dest / "python_router" / "model.py").symlink_to(model_file.resolve())
    return dest


# Secrets that the launcher's environment may hold and tritonserver's must not: the OpenAI API key (the
# OpenAI server's alone) and the pair secret (moved into a file first: TritonServer.start)
SECRET_ENVS = (API_KEY_ENV, PAIR_SECRET_ENV)


def server_env(install: TritonInstall, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver and its stubs.

    The stub links libpython and finds its prefix by looking up `python3` on PATH; with this
    interpreter's bin first, a virtual environment's pyvenv.cfg is honoured, so the stub sees
    the same site-packages (including .pth files of editable installs) as this process.
    """
    if install.stub is not None:
        check_numpy_for_wheel_stub()
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    lib_dirs = [str(d) for d in install.lib_dirs]
    if install.stub is not None and sysconfig.get_config_var("Py_ENABLE_SHARED"):
        # the wheel's stub links libpython3.X from the loader path; this interpreter's own libpython
        # must win over the system's, or extension modules of this stdlib (e.g. _ssl) fail to load.
        # Not with a system Triton (the NGC image): its stub is built for the image's Python, and the
        # system library dir first would load the host driver's libcuda before NVIDIA's CUDA
        # forward-compatibility libraries that the image's entrypoint put on LD_LIBRARY_PATH.
        lib_dirs.insert(0, sysconfig.get_config_var("LIBDIR"))
    if lib_dirs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*lib_dirs, *filter(None, [env.get("LD_LIBRARY_PATH")])])
    env.pop("PYTHONHOME", None)  # would point the embedded interpreter at another installation
    for name in SECRET_ENVS:  # whatever a stub starts inherits them; /proc/<pid>/environ shows them
        env.pop(name, None)
    return env


def check_numpy_for_wheel_stub() -> None:
    """The nvidia-pytriton wheel's stub (Triton 2.51) was built with a pybind11 that reads numpy 1's
    dtype layout: under numpy 2 every tensor it hands to Python is garbled (a BYTES input "hello"
    arrives as copies of its first byte) and the stub aborts. tools/install.sh pins numpy 1.26."""
    import numpy

    if int(numpy.__version__.split(".")[0]) >= 2:
        raise TritonError(f"the bundled tritonserver's Python stub needs numpy 1.x, found {numpy.__version__}: "
                          "run tools/install.sh, or `pip install --no-deps numpy==1.26.4`")

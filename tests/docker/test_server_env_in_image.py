"""In the NGC image (a system tritonserver) the launcher leaves LD_LIBRARY_PATH as NVIDIA's entrypoint set it."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from tokenrouter.launch.triton_install import TritonInstall, server_env

COMPAT = "/usr/local/cuda/compat/lib.real"  # where the entrypoint puts CUDA forward compatibility


def test_a_system_triton_keeps_the_images_library_path() -> None:
    install = TritonInstall(binary=Path("/opt/tritonserver/bin/tritonserver"),
                            backends=Path("/opt/tritonserver/backends"))
    env = server_env(install, base={"LD_LIBRARY_PATH": COMPAT, "PATH": "/usr/bin"})
    assert env["LD_LIBRARY_PATH"] == COMPAT


@pytest.mark.skipif(not sysconfig.get_config_var("Py_ENABLE_SHARED"), reason="this Python links libpython statically")
def test_the_wheels_stub_still_gets_this_pythons_libpython_first(tmp_path: Path) -> None:
    install = TritonInstall(binary=tmp_path / "tritonserver", backends=tmp_path, lib_dirs=(tmp_path / "libs",),
                            stub=tmp_path / "stub")
    env = server_env(install, base={"LD_LIBRARY_PATH": COMPAT, "PATH": "/usr/bin"})
    assert env["LD_LIBRARY_PATH"].split(":") == [sysconfig.get_config_var("LIBDIR"), str(tmp_path / "libs"), COMPAT]

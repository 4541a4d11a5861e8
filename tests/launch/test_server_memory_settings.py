"""What keeps tritonserver's memory from holding on to hostile requests (the soak test measures the
effect: tests/reliability/test_soak.py): no gRPC request pool, and glibc's mmap threshold fixed."""

from __future__ import annotations

from pathlib import Path

from tokenrouter.launch.triton_install import TritonInstall, server_env
from tokenrouter.launch.triton_server import Ports, TritonServer

INSTALL = TritonInstall(Path("tritonserver"), Path("."))


def test_the_command_turns_triton_s_grpc_request_pool_off() -> None:
    command = TritonServer(Path("repo"), Path("backends"), INSTALL, Ports(1, 2, 3)).command()
    assert "--grpc-infer-allocation-pool-size=0" in command


def test_the_server_environment_fixes_glibc_s_mmap_threshold_at_1_mb() -> None:
    assert server_env(INSTALL, base={"PATH": "/usr/bin"})["MALLOC_MMAP_THRESHOLD_"] == "1048576"


def test_an_operator_s_own_mmap_threshold_wins() -> None:
    env = server_env(INSTALL, base={"PATH": "/usr/bin", "MALLOC_MMAP_THRESHOLD_": "4194304"})
    assert env["MALLOC_MMAP_THRESHOLD_"] == "4194304"

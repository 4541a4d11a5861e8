"""The suite's own layout: what tests share lives in conftest.py files and tests/helpers/, never in a test
module that another imports (importing one runs its module code a second time under another name, and
ties one module's tests to another's internals)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def imported_modules(path: Path) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.append(node.module)
        elif isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
    return modules


def test_no_test_file_imports_a_test_module_or_a_conftest() -> None:
    offenders = {str(path.relative_to(TESTS)): module for path in sorted(TESTS.rglob("*.py"))
                 for module in imported_modules(path)
                 if module.rsplit(".", 1)[-1].startswith("test_") or module.rsplit(".", 1)[-1] == "conftest"}
    assert offenders == {}, "move what they share to tests/helpers/ (or a fixture to a conftest.py)"


def test_the_files_that_share_a_session_server_are_one_unit_of_work() -> None:
    """Catches a split that sends them to both workers (each would start the server: helpers/worker_groups.py)."""
    from helpers.worker_groups import FilesAndSharedServers

    scheduler = FilesAndSharedServers.__new__(FilesAndSharedServers)  # (the split alone: no xdist session)
    scope = scheduler._split_scope
    assert scope("tests/e2e/test_routing_server.py::test_a") == scope("tests/reliability/test_cancellation.py::t") \
        == scope("tests/e2e/test_openai_api.py::t") == "routing server"
    assert scope("tests/engine/test_vllm_engine.py::t[x]") == scope("tests/e2e/test_vllm_server.py::t") \
        == "vLLM engines"
    assert scope("tests/e2e/test_frontend.py::t") == scope("tests/e2e/test_third_party_shapes.py::t") == "echo server"
    assert scope("tests/reliability/test_faults.py::t[llm]") == scope("tests/reliability/test_loop_death.py::t") \
        == scope("tests/reliability/test_reload_after_burst.py::t") == "supervised launcher"
    assert scope("tests/test_procfs.py::test_a") == scope("tests/test_procfs.py::test_b") == "tests/test_procfs.py"

"""The package's layout holds: each folder of serving/ is one process, and the product needs no developer tool.

The front and the subserver run in different Triton stubs and share only the top of serving/
(the tensor schema, wire constants, peer auth, error codes, cancellation polling, the repository
renderer); the standalone text models import neither; the top imports none of the three. And
nothing in the tokenrouter package (the launcher included) imports tokenrouter_tools: the CLI only
names their modules, for importlib, when one of their subcommands runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tokenrouter

PACKAGE = Path(tokenrouter.__file__).parent
SERVING = "tokenrouter.serving"
# folder -> the serving folders it must not import
FORBIDDEN = {
    "front": ("subserver",),
    "subserver": ("front", "text"),
    "text": ("front", "subserver"),
    "": ("front", "subserver", "text"),  # the shared top
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, relative imports resolved, lazy (in-function) ones included."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = node.module if node.level == 0 else ".".join(filter(None, (base, node.module)))
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # `from . import x`
    return found


def _serving_files() -> list[Path]:
    return sorted((PACKAGE / "serving").rglob("*.py"))


@pytest.mark.parametrize("path", _serving_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_serving_folder_imports_only_itself_and_the_shared_top(path: Path) -> None:
    folder = path.parent.relative_to(PACKAGE / "serving").as_posix()
    folder = "" if folder == "." else folder
    crossing = sorted(m for m in imported_modules(path)
                      if m.startswith(f"{SERVING}.") and m.split(".")[2] in FORBIDDEN[folder])
    assert not crossing, f"{path.relative_to(PACKAGE)} imports {crossing}"


def test_the_package_imports_no_developer_tool() -> None:
    offenders = {str(path.relative_to(PACKAGE)): sorted(m for m in imported_modules(path)
                                                         if m.split(".")[0] == "tokenrouter_tools")
                 for path in PACKAGE.rglob("*.py")}
    assert not {path: modules for path, modules in offenders.items() if modules}


def test_relative_imports_resolve_to_real_modules() -> None:
    """The checker's own resolution: a wrong level would make the tests above pass vacuously."""
    front_model = imported_modules(PACKAGE / "serving" / "front" / "front_model.py")
    assert {"tokenrouter.serving.schema", "tokenrouter.request_builder", "tokenrouter.serving.front.front_writer",
            "tokenrouter.serving.text.text_inputs"} <= front_model


@pytest.mark.parametrize("path", _serving_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_serving_file_is_on_both_maps(path: Path) -> None:
    """serving/__init__.py and docs/runtime.md say which process runs each file and what it does there;
    a file missing from them is one a newcomer cannot place."""
    if path.name == "__init__.py":
        return
    relative = path.relative_to(PACKAGE / "serving").as_posix()
    assert path.name in (PACKAGE / "serving" / "__init__.py").read_text(), f"{relative} is not on serving's map"
    runtime_doc = PACKAGE.parents[2] / "docs" / "runtime.md"
    assert f"`serving/{relative}" in runtime_doc.read_text() or (
        f"`{path.name}`" in runtime_doc.read_text()), f"{relative} is not on docs/runtime.md's map"

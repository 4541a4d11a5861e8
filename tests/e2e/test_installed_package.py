"""A non-editable install works: the wheel carries everything the command line reads at run time.

The project's wheel is built and unpacked into a fresh virtual environment that borrows only the
third-party dependencies from this one; then, from an empty folder, the CLI finds its shipped
configs, recipes and Triton backend entry inside the installed packages and `tokenrouter serve
--tiny` answers a request. Catches data files left out of the wheel and paths computed from the
checkout (they point nowhere once installed).
"""

from __future__ import annotations

import signal
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tokenrouter.client import http_generate
from .test_serve import _descendants, _launch, _stop_and_check

CHECKOUT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the installed environment's python, its site-packages)."""
    wheels = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(wheels), str(CHECKOUT)], check=True, timeout=300)
    [wheel] = wheels.glob("tokenrouter_triton-*.whl")
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site_packages = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    with zipfile.ZipFile(wheel) as archive:  # a pure-Python wheel installs by unpacking
        archive.extractall(site_packages)
    # torch, transformers, Triton's wheel... from this environment. Its editable-install hook for
    # this project is a .pth there, which is not processed from here: the wheel's copy is the one found.
    (site_packages / "zz_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv / "bin" / "python", site_packages


def test_the_installed_cli_finds_its_files_in_the_installed_packages(installed, tmp_path: Path) -> None:
    python, site_packages = installed
    probe = """
import json, tokenrouter, tokenrouter_engines, tokenrouter_tools
from tokenrouter_engines.recipe import load_recipe
from tokenrouter.launch.paths import backend_model_file, shipped_config, shipped_configs
print(json.dumps({"modules": [m.__file__ for m in (tokenrouter, tokenrouter_engines, tokenrouter_tools)],
                  "configs": shipped_configs(), "tiny": str(shipped_config("tiny.yaml")),
                  "backend": str(backend_model_file()), "recipe": type(load_recipe()).__name__}))
"""
    done = subprocess.run([str(python), "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    found = json.loads(done.stdout.strip().splitlines()[-1])
    for path in [*found["modules"], found["tiny"], found["backend"]]:
        assert Path(path).is_relative_to(site_packages), path
    assert {"tiny.yaml", "qwen2.5-coder.yaml", "qwen2.5-coder-gpu.yaml"} <= set(found["configs"])
    assert found["recipe"] == "PairRecipe"


def test_the_installed_package_serves_the_tiny_pair_from_an_empty_folder(installed, tmp_path: Path) -> None:
    python, _ = installed
    launcher, ports = _launch("--tiny", python=str(python), cwd=tmp_path)
    try:
        server_pids = _descendants(launcher.pid)
        reply = http_generate(f"127.0.0.1:{ports.http}", {"text_input": "def add(a, b):", "max_tokens": 8})
        assert reply["finish_reason"] == "length" and len(reply["output_ids"]) == 8
        assert (tmp_path / ".runtime" / "repositories" / "tiny").is_dir()  # state in the project folder
        _stop_and_check(launcher, signal.SIGTERM, server_pids)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()

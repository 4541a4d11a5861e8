"""The project installs like a user installs it, and the installed command serves.

The wheel is built, then installed into a fresh virtual environment that sees nothing of this one
(no site-packages borrowed) with pip resolving its dependencies from pyproject.toml against the
pinned versions of requirements.txt (torch as its CPU build, never a plain torch), plus what
tools/install.sh adds apart (numpy for Triton's stub, nvidia-pytriton for the tritonserver binary,
both without dependencies). Then, from an empty folder outside the checkout, the installed
`tokenrouter serve --tiny` serves (Triton, the OpenAI server beside it, its restart alone, Ctrl-C): the
suite's only `serve --tiny` start. Catches a runtime dependency pyproject.toml does not declare, data
files left out of the wheel, and paths computed from the checkout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import openai
import pytest

from tokenrouter.client import http_generate
from tokenrouter.launch.processes import process_alive
from tokenrouter.openai_server.app import API_KEY_ENV
from helpers.launcher import descendants, launch, stop_and_check, triton_pid

CHECKOUT = Path(__file__).resolve().parents[2]
# What the wheel installs at the top level of site-packages (besides its .dist-info).
TOP_LEVEL = {"tokenrouter", "tokenrouter_engines", "tokenrouter_tools"}


def installed_apart() -> list[str]:
    """What tools/install.sh installs without dependencies after requirements.txt."""
    found = re.search(r"--no-deps (numpy==\S+) (nvidia-pytriton==\S+)", (CHECKOUT / "tools" / "install.sh").read_text())
    assert found, "tools/install.sh no longer installs numpy and nvidia-pytriton apart: update this test"
    return list(found.groups())


def pinned_constraints() -> list[str]:
    """requirements.txt's pins as constraints (pip takes no extras or editable lines in those), and
    the numpy install.sh pins for Triton's Python stub (so that the resolver never picks another)."""
    pins = []
    for line in (CHECKOUT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            pins.append(re.sub(r"\[[^\]]*\]", "", line))
    return [*pins, installed_apart()[0]]


def bench_modules() -> set[str]:
    """The modules of pyproject.toml's optional `bench` dependencies (what the benchmarks import)."""
    text = (CHECKOUT / "pyproject.toml").read_text()
    names = re.findall(r'"([A-Za-z0-9_.-]+)', re.search(r"^bench = \[(.*)\]$", text, re.M).group(1))
    return {name.replace("-", "_") for name in names}


def source_copy(dest: Path) -> Path:
    """What the wheel is built from, copied: setuptools builds in the source tree and its build/ keeps
    the files of earlier builds, so a wheel built in the checkout can ship modules that are gone."""
    shutil.copy(CHECKOUT / "pyproject.toml", dest)
    shutil.copy(CHECKOUT / "README.md", dest)
    package_dirs = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for folder in package_dirs.values():
        skip = shutil.ignore_patterns("__pycache__", "build", "cache")
        shutil.copytree(CHECKOUT / folder, dest / folder, ignore=skip)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the installed environment, its site-packages)."""
    wheels = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--wheel-dir", str(wheels), str(source_copy(tmp_path_factory.mktemp("source")))],
                   check=True, timeout=300)
    [wheel] = wheels.glob("tokenrouter_triton-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        top = {name.split("/", 1)[0] for name in archive.namelist()}
    assert {name for name in top if not name.endswith(".dist-info")} == TOP_LEVEL, top
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    constraints = venv / "constraints.txt"
    constraints.write_text("\n".join(pinned_constraints()) + "\n")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile"]
    subprocess.run([*pip, str(wheel), "-c", str(constraints)], check=True, timeout=1200)
    subprocess.run([*pip, "--no-deps", *installed_apart()], check=True, timeout=600)
    site_packages = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    return venv, site_packages


def clean_env(venv: Path) -> dict[str, str]:
    """The installed environment's command first on PATH, and nothing pointing into this checkout."""
    assert not any(key.startswith("PYTHONPATH") for key in os.environ), "PYTHONPATH would leak the checkout"
    return {"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "VIRTUAL_ENV": str(venv)}


def test_the_installed_cli_finds_its_files_in_the_installed_packages(installed, tmp_path: Path) -> None:
    venv, site_packages = installed
    probe = """
import importlib, json, pkgutil, tokenrouter, tokenrouter_engines, tokenrouter_tools
from tokenrouter_engines.recipe import load_recipe
from tokenrouter.launch.paths import backend_model_file, shipped_config, shipped_configs
missing = {}
for package in (tokenrouter, tokenrouter_engines, tokenrouter_tools):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        try:
            importlib.import_module(module.name)
        except ImportError as error:
            missing[module.name] = error.name or str(error)
print(json.dumps({"modules": [m.__file__ for m in (tokenrouter, tokenrouter_engines, tokenrouter_tools)],
                  "configs": shipped_configs(), "tiny": str(shipped_config("tiny.yaml")),
                  "backend": str(backend_model_file()), "recipe": type(load_recipe()).__name__,
                  "missing": missing}))
"""
    done = subprocess.run([str(venv / "bin" / "python"), "-c", probe], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **clean_env(venv)})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for path in [*found["modules"], found["tiny"], found["backend"]]:
        assert Path(path).is_relative_to(site_packages), path
    assert {"tiny.yaml", "qwen2.5-coder.yaml", "qwen2.5-coder-gpu.yaml"} <= set(found["configs"])
    assert found["recipe"] == "PairRecipe"
    # Every module imports with the declared dependencies alone, but for Triton's module (it exists
    # only inside a stub), in the developer tools pyproject's optional `bench` dependencies, and in the
    # fleet its optional `fleet` one (NVIDIA Dynamo, whose module is `dynamo`).
    for module, missing in found["missing"].items():
        tools, fleet = module.startswith("tokenrouter_tools"), module.startswith("tokenrouter.fleet")
        allowed = {"triton_python_backend_utils"} | (bench_modules() if tools else set())
        allowed |= {"dynamo"} if fleet else set()
        assert missing in allowed, f"{module} imports {missing}, which pyproject.toml does not declare"


def test_the_installed_command_serves_the_tiny_pair_from_a_folder_outside_the_checkout(installed, tmp_path) -> None:
    """`tokenrouter serve --tiny` as a user runs it once installed: configs/tiny.yaml on the tiny pair,
    over Triton and over the OpenAI API beside it (with the key of TOKENROUTER_API_KEY); a killed OpenAI
    server is restarted alone, Triton untouched; Ctrl-C stops it all without orphans."""
    venv, _ = installed
    assert not tmp_path.is_relative_to(CHECKOUT)
    launcher, ports = launch("--tiny", command=[str(venv / "bin" / "tokenrouter")], cwd=tmp_path,
                              env={**clean_env(venv), API_KEY_ENV: "k-1"})
    try:
        server_pids = descendants(launcher.pid)
        reply = http_generate(f"127.0.0.1:{ports.http}", {"text_input": "def add(a, b):", "max_tokens": 24})
        assert reply["finish_reason"] == "length" and len(reply["output_ids"]) == 24
        assert set(reply["output_models"]) == {"slm", "llm"}  # random policy, rate 0.3: both write
        assert 0.0 < reply["large_model_share"] < 1.0
        assert (tmp_path / ".runtime" / "repositories" / "tiny").is_dir()  # state in the project folder
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{launcher.openai_port}/v1", api_key="k-1", max_retries=0)
        chat = api.chat.completions.create(model="tokenrouter", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=24, temperature=0)
        assert chat.usage.completion_tokens == 24 and 0.0 < chat.choices[0].large_model_share < 1.0
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=api.base_url, api_key="wrong", max_retries=0).models.list()
        (api_pid,) = [pid for pid in server_pids
                      if b"tokenrouter.openai_server" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        triton = triton_pid(launcher.pid)
        os.kill(api_pid, signal.SIGKILL)
        lines = []
        for line in launcher.stdout:  # the supervisor's account of it
            lines.append(line)
            if "the OpenAI server is ready again" in line:
                break
        assert any("the OpenAI server exited with code -9; restarting it" in line for line in lines), lines[-20:]
        assert api.completions.create(model="tokenrouter", prompt="x", max_tokens=3).usage.completion_tokens == 3
        assert process_alive(triton) and triton_pid(launcher.pid) == triton and not process_alive(api_pid)
        stop_and_check(launcher, signal.SIGINT, descendants(launcher.pid) + server_pids)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()

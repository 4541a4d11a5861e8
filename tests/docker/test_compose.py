"""docker/: the compose file and the Dockerfile, checked without a Docker engine.

Structure is checked with yaml always. Where a Compose implementation is installed (the
`docker compose` v2 plugin, or Debian's `docker-compose` 1.29), its own `config` command
validates the file against its schema and resolves profiles; that part is skipped otherwise.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"
COMPOSE = DOCKER / "docker-compose.yml"
MODELS_MOUNT = "/opt/tokenrouter/engines/build/models"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _compose_command() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_gpu_service_reserves_gpus_and_serves_on_the_three_ports(compose: dict) -> None:
    gpu = compose["services"]["tokenrouter"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert "profiles" not in gpu  # `docker compose up` starts it
    assert "trtllm" not in str(gpu["build"].get("args", {}))  # the Dockerfile's default base: trtllm-python-py3


@pytest.mark.parametrize("service", ["tokenrouter", "tokenrouter-cpu"])
def test_servers_share_ports_shm_volume_and_wait_for_models(compose: dict, service: str) -> None:
    server = compose["services"][service]
    assert sorted(server["ports"]) == ["8000:8000", "8001:8001", "8002:8002"]
    assert server["shm_size"]
    assert f"models:{MODELS_MOUNT}" in server["volumes"]
    assert server["depends_on"]["models"]["condition"] == "service_completed_successfully"
    assert server["command"][0] == "serve"


def test_cpu_profile_has_no_gpu_reservation(compose: dict) -> None:
    cpu = compose["services"]["tokenrouter-cpu"]
    assert cpu["profiles"] == ["cpu"] and "deploy" not in cpu
    assert cpu["build"]["args"]["BASE_IMAGE"].endswith("-py3") and "trtllm" not in cpu["build"]["args"]["BASE_IMAGE"]


def test_models_is_a_one_shot_pull_into_the_volume(compose: dict) -> None:
    models = compose["services"]["models"]
    assert models["command"] == ["models", "pull"] and models["restart"] == "no"
    assert f"models:{MODELS_MOUNT}" in models["volumes"]
    assert "models" in compose["volumes"]


def test_dockerfile_installs_the_package_and_places_the_backend() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=nvcr.io/nvidia/tritonserver:" in text and "-trtllm-python-py3" in text
    assert "pip install --no-cache-dir -e ." in text
    assert "/opt/tritonserver/backends/python_router/model.py" in text
    assert f"VOLUME {MODELS_MOUNT}" in text
    for copied in ("backends", "engines", "tools", "configs", "model_repository"):
        assert f"COPY {copied} ./{copied}" in text
        assert (DOCKER.parent / copied).is_dir()


def test_compose_config_validates_and_resolves_profiles(tmp_path: Path) -> None:
    command = _compose_command()
    if command is None:
        pytest.skip("no Compose implementation installed (docker compose plugin or docker-compose)")
    run = lambda *args: subprocess.run([*command, "-f", str(COMPOSE), *args], capture_output=True, text=True,
                                       cwd=DOCKER)
    checked = run("config", "-q")
    assert checked.returncode == 0, checked.stderr
    # (compose v1 lists profiled services without --profile too; v2 does not)
    assert sorted(run("--profile", "cpu", "config", "--services").stdout.split()) == [
        "models", "tokenrouter", "tokenrouter-cpu"]
    # the validator is real: a misspelt key fails
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace("shm_size:", "shm_sise:"))
    bad = subprocess.run([*command, "-f", str(broken), "config", "-q"], capture_output=True, text=True, cwd=DOCKER)
    assert bad.returncode != 0 and "shm_sise" in bad.stderr

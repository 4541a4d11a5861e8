"""TextCodec on the tokenizers-only path (tokenizer_files) equals transformers' AutoTokenizer: plain and
chat prompts, stop-word sequences, end ids, decoding of any ids, and stable text over every cut.

Folders: each tiny family's tokenizer (engines/tiny.py), three built here from the same vocabulary
with the settings real models use (a Llama-style BOS added on encoding with a template that uses
``bos_token`` and ``raise_exception``; a SentencePiece-style byte-fallback BPE whose config has
``clean_up_tokenization_spaces`` on and names specials only in special_tokens_map.json; named chat
templates with a non-special added token), and the real Qwen2.5-Coder tokenizer when it is installed.
``TEXT_ORACLE_FOLDERS`` (folders joined by ``os.pathsep``) adds other tokenizer folders to a run.
"""

from __future__ import annotations

import json
import os
import random
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tokenrouter.text import REPLACEMENT, TextCodec, load_tokenizer
from tokenrouter.tokenizer_files import FileTokenizer
from tokenrouter_engines.tiny import FAMILIES, ensure_tiny_pair

REAL_TOKENIZER = Path(__file__).resolve().parents[1] / "engines/build/models/qwen2.5-coder-0.5b-instruct"
PROMPTS = [
    "def fibonacci(n):\n    return n",
    "héllo wörld — naïve café",
    "你好，世界。数据结构与算法",
    "emoji 🙂🚀👩‍💻 and flags 🇫🇷 mixed: print('ok')",
    "  leading and trailing spaces  \n\n\t tabs\r\nand CRLF ",
    "rare 𓀀𓀀 x𓀀",
    "specials in text: <|im_start|>user<|im_end|> <s></s>",
    "",
    " ",
]
WORDS = ["\ndef", "\n\nclass", " return", "🙂", "<|im_end|>", "", "x"]
CHAT = [{"role": "system", "content": "You write code."}, {"role": "user", "content": "Sort a list 🙂"},
        {"role": "assistant", "content": "sorted(xs)"}, {"role": "user", "content": "  and in reverse? "}]

LLAMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role') }}{% endif %}"
    "{%- if message['role'] == 'user' -%}  [INST] {{ message['content'] | trim }} [/INST]\n"
    "{%- elif message['role'] == 'system' -%}\n  <<SYS>>{{ message['content'] | tojson }}<</SYS>>\n"
    "{%- else %} {{ message['content'] }}{{ eos_token }}{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}{% generation %}ASSISTANT:{% endgeneration %}{% endif %}"
    "{% endfor %}"
)
NAMED_TEMPLATES = [
    {"name": "tool_use", "template": "{{ 'tools' }}"},
    {"name": "default", "template": "{% for m in messages %}<tool_call>{{ m.role }}:{{ m.content }}\n{% endfor %}"
                                    "{% if add_generation_prompt %}<|assistant|>{% endif %}"},
]


# transformers re-reads this folder with Qwen2Tokenizer (its config.json says qwen2), whose pre-tokenizer is not
# the file's; the codec encodes as the file says (test_a_folder_is_encoded_as_its_tokenizer_json_says).
REBUILT_BY_TRANSFORMERS = {"tiny-qwen2": "transformers encodes this folder with Qwen2's pre-tokenizer, not the file's"}


def _corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [(stdlib / name).read_text(encoding="utf-8") for name in ("textwrap.py", "string.py", "shlex.py")] + PROMPTS


def _write(folder: Path, tokenizer: Tokenizer, config: dict[str, Any], **files: Any) -> Path:
    folder.mkdir(parents=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    for name, content in files.items():
        (folder / f"{name}.json").write_text(json.dumps(content))
    return folder


def llama_style(folder: Path) -> Path:
    """Byte-level BPE without a post-processor: the BOS comes from tokenizer_config's add_bos_token."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return _write(folder, tokenizer, {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                                      "eos_token": {"content": "</s>", "__type": "AddedToken"}, "add_bos_token": True,
                                      "pad_token": "<pad>", "chat_template": LLAMA_TEMPLATE})


def sentencepiece_style(folder: Path) -> Path:
    """Metaspace BPE with byte fallback (as Llama 2 and Mistral); specials named in special_tokens_map.json
    only; its config asks for space clean-up, which the codec's decode must not do; a chat template that
    writes the BOS the post-processor also adds."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{value:02X}>" for value in range(256)]
    tokenizer.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=800, special_tokens=["<unk>", "<s>", "</s>", *byte_tokens], show_progress=False))
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                             special_tokens=[("<s>", tokenizer.token_to_id("<s>"))])
    # Llama 2's way: the post-processor adds a BOS on encoding and the chat template writes one too, so a chat
    # prompt must be encoded without the tokenizer's specials (or it starts with two)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": True,
              "chat_template": LLAMA_TEMPLATE}
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    return _write(folder, tokenizer, config, special_tokens_map=specials)


def named_templates(folder: Path, tiny: Path) -> Path:
    """The tiny vocabulary with a non-special added token (kept by decoding), an extra special token
    that tokenizer.json lacks, and the chat template chosen by name from several."""
    tokenizer = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    tokenizer.add_tokens([AddedToken("<tool_call>", special=False, normalized=False)])
    return _write(folder, tokenizer, {"tokenizer_class": "TokenizersBackend", "eos_token": "<|endoftext|>",
                                      "extra_special_tokens": ["<|assistant|>"], "chat_template": NAMED_TEMPLATES})


@pytest.fixture(scope="module")
def built_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    tiny = ensure_tiny_pair("qwen3", 0)["small"]
    folders = {f"tiny-{family}": ensure_tiny_pair(family, 0)["small"] for family in FAMILIES}
    folders.update({"llama-style": llama_style(root / "llama"), "sentencepiece-style": sentencepiece_style(root / "sp"),
                    "named-templates": named_templates(root / "named", tiny)})
    return folders


def _other_folders() -> list[str]:
    extra = [path for path in os.environ.get("TEXT_ORACLE_FOLDERS", "").split(os.pathsep) if path]
    return ["qwen2.5-coder", *extra]


@pytest.fixture(scope="module", params=["tiny-qwen2", "tiny-qwen3", "tiny-llama", "llama-style", "sentencepiece-style",
                                        "named-templates", *_other_folders()])
def pair(request: pytest.FixtureRequest, built_folders: dict[str, Path]) -> tuple[FileTokenizer, Any]:
    """(the tokenizers-only tokenizer, transformers' AutoTokenizer) of one folder."""
    from transformers import AutoTokenizer

    if request.param in built_folders:
        folder = built_folders[request.param]
    elif request.param == "qwen2.5-coder":
        if not (REAL_TOKENIZER / "tokenizer.json").is_file():
            pytest.skip("the real Qwen2.5-Coder tokenizer is not installed (tokenrouter models pull)")
        folder = REAL_TOKENIZER
    else:
        folder = Path(request.param)
    fast = load_tokenizer(folder)
    assert isinstance(fast, FileTokenizer)
    return fast, AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture
def encoding_pair(request: pytest.FixtureRequest, pair: tuple[FileTokenizer, Any]) -> tuple[FileTokenizer, Any]:
    """``pair``, for the comparisons of encoding (skipped where transformers reads another pipeline)."""
    name = request.node.callspec.params["pair"]
    if name in REBUILT_BY_TRANSFORMERS:
        pytest.skip(REBUILT_BY_TRANSFORMERS[name])
    return pair


def oracle_end_ids(hf: Any, engine_eos: list[int], chat: bool) -> list[int]:
    """End ids as TextCodec computed them on transformers (the model's eos, the tokenizer's, <|im_end|> in chat)."""
    ids = set(engine_eos) | ({hf.eos_token_id} if hf.eos_token_id is not None else set())
    im_end = hf.convert_tokens_to_ids("<|im_end|>")
    if chat and isinstance(im_end, int) and im_end != hf.unk_token_id:
        ids.add(im_end)
    return sorted(ids)


def test_vocabulary_and_named_ids(encoding_pair: tuple[FileTokenizer, Any]) -> None:
    fast, hf = encoding_pair
    assert len(fast) == len(hf)
    assert (fast.eos_token_id, fast.pad_token_id, fast.unk_token_id) == (hf.eos_token_id, hf.pad_token_id,
                                                                         hf.unk_token_id)
    assert fast.special_tokens == hf.special_tokens_map


def test_plain_prompts_and_stop_words(encoding_pair: tuple[FileTokenizer, Any]) -> None:
    fast, hf = encoding_pair
    codec = TextCodec(fast)
    for prompt in PROMPTS:
        assert codec.encode_prompt(prompt) == hf.encode(prompt, add_special_tokens=True), prompt
        assert fast.encode(prompt, add_special_tokens=False) == hf.encode(prompt, add_special_tokens=False), prompt
    assert codec.token_sequences(WORDS) == [ids for ids in (hf.encode(w, add_special_tokens=False) for w in WORDS if w)
                                            if ids]


def test_chat_prompts(encoding_pair: tuple[FileTokenizer, Any]) -> None:
    fast, hf = encoding_pair
    assert fast.chat_template == hf.chat_template or isinstance(hf.chat_template, dict)
    if hf.chat_template is None:
        pytest.skip("this tokenizer has no chat template")
    codec = TextCodec(fast, chat_template=True)
    for prompt in PROMPTS:
        expected = hf.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False)
        assert codec.encode_prompt(prompt) == list(expected), prompt
        assert TextCodec(fast).encode_prompt(prompt, chat_template=True) == list(expected)
    for generation_prompt in (True, False):
        assert fast.render_chat(CHAT, add_generation_prompt=generation_prompt) == hf.apply_chat_template(
            CHAT, add_generation_prompt=generation_prompt, tokenize=False)


def test_end_ids(pair: tuple[FileTokenizer, Any]) -> None:
    fast, hf = pair
    for chat in (False, True):
        for engine_eos in ([], [0], [len(hf) - 1, 3]):
            assert TextCodec(fast, chat_template=chat).end_ids(engine_eos) == oracle_end_ids(hf, engine_eos, chat)


def test_decoding_any_ids(pair: tuple[FileTokenizer, Any]) -> None:
    """Random ids over the whole vocabulary (specials, byte pieces, added tokens), as transformers decodes
    them with skip_special_tokens and no clean-up."""
    fast, hf = pair
    codec, rng = TextCodec(fast), random.Random(0)
    specials = sorted(hf.all_special_ids)
    for _ in range(300):
        ids = [rng.randrange(len(hf)) for _ in range(rng.randrange(0, 24))]
        ids = [rng.choice(specials) if specials and rng.random() < 0.15 else i for i in ids]
        assert codec.decode(ids) == hf.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False), ids


def test_stable_text_over_every_cut(pair: tuple[FileTokenizer, Any]) -> None:
    """Each prefix of a prompt's ids: the text without a trailing partial character, and the whole decode
    when final, as transformers' decode gives them."""
    fast, hf = pair
    codec = TextCodec(fast)
    for prompt in PROMPTS:
        ids = hf.encode(prompt, add_special_tokens=False)
        for end in range(len(ids) + 1):
            whole = hf.decode(ids[:end], skip_special_tokens=True, clean_up_tokenization_spaces=False)
            assert codec.stable_text(ids[:end], final=True) == whole
            assert codec.stable_text(ids[:end], final=False) == whole.rstrip(REPLACEMENT)


def test_the_fallback_reads_what_the_fast_path_cannot(tmp_path: Path, tiny_tokenizer: Path) -> None:
    """A folder without tokenizer.json (vocab.json + merges.txt) goes to transformers, and reads the same."""
    from tokenrouter.hf_tokenizer import HFTokenizer

    folder = tmp_path / "slow"
    folder.mkdir()
    Tokenizer.from_file(str(tiny_tokenizer / "tokenizer.json")).model.save(str(folder))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|im_end|>", "unk_token": None, "bos_token": None}))
    fallback, fast = load_tokenizer(folder), load_tokenizer(tiny_tokenizer)
    assert isinstance(fallback, HFTokenizer)
    for prompt in PROMPTS[:6]:
        ids = fast.encode(prompt, add_special_tokens=False)
        assert fallback.encode(prompt, add_special_tokens=False) == ids
        assert fallback.decode(ids) == fast.decode(ids) == prompt


def test_a_folder_is_encoded_as_its_tokenizer_json_says(built_folders: dict[str, Path]) -> None:
    folder = built_folders["tiny-qwen2"]
    as_written = Tokenizer.from_file(str(folder / "tokenizer.json"))
    codec = TextCodec.from_path(folder)
    for prompt in PROMPTS:
        assert codec.encode_prompt(prompt) == as_written.encode(prompt).ids

"""Editing a config.pbtxt parameter and reloading the model through the repository API takes effect."""

from __future__ import annotations

from pathlib import Path

from .clients import http_generate, http_post
from .conftest import StartServer, render_echo_repository


def test_chat_template_switched_on_by_editing_and_reloading(start_server: StartServer, tiny_tokenizer: Path,
                                                            tmp_path: Path) -> None:
    repo = render_echo_repository(tmp_path / "repo", tiny_tokenizer, chat_template=False)
    server = start_server(repo)
    assert http_generate(server.http_url, {"text_input": "hello"})["text_output"] == "hello"

    pbtxt = repo / "preprocessing" / "config.pbtxt"
    edited = pbtxt.read_text().replace('string_value: "false"', 'string_value: "true"')
    assert edited != pbtxt.read_text()
    pbtxt.write_text(edited)
    status, body = http_post(server.http_url, "/v2/repository/models/preprocessing/load")
    assert status == 200, body

    # the echo double returns the prompt, now ChatML-wrapped (special tokens are not shown), up to
    # the first default end id, which in chat mode includes <|im_end|>
    reply = http_generate(server.http_url, {"text_input": "hello", "max_tokens": 100})
    assert (reply["text_output"], reply["finish_reason"]) == ("user\nhello", "eos")

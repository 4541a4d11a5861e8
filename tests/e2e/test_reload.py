"""Editing a config.pbtxt parameter and reloading the model through the repository API takes effect."""

from __future__ import annotations

from pathlib import Path

from tokenrouter.client import http_generate, http_post

from .conftest import StartServer, render_echo_repository


def test_chat_template_switched_on_by_editing_and_reloading(start_server: StartServer, tiny_tokenizer: Path,
                                                            tmp_path: Path) -> None:
    repo = render_echo_repository(tmp_path / "repo", tiny_tokenizer, chat_template=False)
    server = start_server(repo)
    body = {"text_input": "hello", "max_tokens": 100, "exclude_input_in_output": True}
    assert http_generate(server.http_url, body)["text_output"] == "hello"

    pbtxt = repo / "tokenrouter" / "config.pbtxt"  # the front tokenizes
    edited = pbtxt.read_text().replace('string_value: "false"', 'string_value: "true"')
    assert edited != pbtxt.read_text()
    pbtxt.write_text(edited)
    status, text = http_post(server.http_url, "/v2/repository/models/tokenrouter/load",
                             headers=server.admin_headers)  # the operator's key: clients are refused
    assert status == 200, text

    # the echo double returns the prompt, now ChatML-wrapped (special tokens are not shown), up to
    # the first default end id, which in chat mode includes <|im_end|>
    reply = http_generate(server.http_url, body)
    assert (reply["text_output"], reply["finish_reason"]) == ("user\nhello", "eos")

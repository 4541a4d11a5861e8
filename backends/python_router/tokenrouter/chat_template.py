"""Chat templates rendered the way transformers' ``apply_chat_template`` renders them, with jinja2 alone.

The environment a template sees: a sandbox with ``trim_blocks`` and ``lstrip_blocks``, loop controls,
a ``{% generation %}`` block (transformers marks assistant spans with it; here it only renders its body),
``tojson`` without HTML escaping, ``raise_exception`` and ``strftime_now``; the variables ``messages``,
``tools``, ``documents``, ``add_generation_prompt`` and the named special tokens (``bos_token``, ...).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Sequence

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}``: the body, unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja's own tojson escapes <, >, & and ' for HTML; chat prompts want the characters themselves
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[GenerationBlock, loopcontrols])
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment.from_string(source)


def render_chat(source: str, messages: Sequence[dict[str, Any]], special_tokens: dict[str, str], *,
                add_generation_prompt: bool) -> str:
    """The conversation as ``source`` writes it (``special_tokens``: name -> text, e.g. bos_token)."""
    if not messages:
        raise ValueError("a chat needs at least one message")
    return compile_template(source).render(messages=list(messages), tools=None, documents=None,
                                           add_generation_prompt=add_generation_prompt, **special_tokens)

"""TokenRouter runtime library: engines, subservers, policies (importable without Triton).

``TokenRouter`` is imported lazily so that light users (the Triton glue's argument
parsing, the config validator) do not pay for importing torch and transformers.
"""

from typing import Any

__all__ = ["TokenRouter", "GenerationResult", "ServerBusy", "load_config"]


def __getattr__(name: str) -> Any:
    if name in ("TokenRouter", "GenerationResult", "GenerationChunk", "RequestHandle", "ServerBusy"):
        from .runtime import api

        return getattr(api, name)
    if name == "load_config":
        from .config import load_config

        return load_config
    raise AttributeError(name)

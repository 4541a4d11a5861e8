"""Control calls: a front's cancel and the launcher's drain and shutdown, through their own input.

A control call is a request whose one input is ``control`` (declared by every subserver, front and
core model): one BYTES element, a JSON object ``{"command": ..., "reason": ..., "keys": [...]}``.
It carries this server start's secret as a request parameter (peer_auth.py); the model checks the
secret before it reads the input, and never reads a control call as peer messages or a prompt.

Commands: ``cancel`` (a front ends the entry's requests it named by ``keys``), ``drain`` (a front
refuses new requests with ``reason`` and says whether any is in flight), ``shutdown`` (every request
in flight ends with an error saying ``reason``). Each model takes the ones it knows and refuses the
others, naming them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..request_builder import RequestError
from .schema import CONTROL_INPUT, CONTROL_INPUTS


@dataclass(frozen=True)
class ControlCall:
    command: str
    reason: str = ""
    keys: tuple[str, ...] = field(default_factory=tuple)

    def row(self) -> np.ndarray:
        """The ``control`` input's value, one row."""
        text = json.dumps({"command": self.command, "reason": self.reason, "keys": list(self.keys)})
        return CONTROL_INPUTS[CONTROL_INPUT].row(text.encode())

    @classmethod
    def read(cls, value: np.ndarray, accepted: tuple[str, ...]) -> ControlCall:
        """The call in a ``control`` input's value; RequestError naming what is wrong, or a command
        not in ``accepted``."""
        if value.size != 1:
            raise RequestError(f"'{CONTROL_INPUT}' must hold one element, got {value.size}")
        raw: Any = value.reshape(-1)[0]
        try:
            call = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        except (AttributeError, UnicodeDecodeError, ValueError):
            raise RequestError(f"'{CONTROL_INPUT}' must be a JSON object") from None
        if not isinstance(call, dict):
            raise RequestError(f"'{CONTROL_INPUT}' must be a JSON object")
        command, reason, keys = call.get("command"), call.get("reason", ""), call.get("keys", [])
        if command not in accepted:
            raise RequestError(f"'{CONTROL_INPUT}': command {command!r} is not one of {', '.join(accepted)}")
        if not isinstance(reason, str) or not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise RequestError(f"'{CONTROL_INPUT}': 'reason' must be a string and 'keys' a list of strings")
        return cls(command, reason, tuple(keys))

"""Triton's Python-based backend `python_router`: `backend: "python_router"` in a config.pbtxt runs this.

Each model instance is a stub process. Parameter `role` picks what it is: a `subserver` (one model's
engine, scheduler, pending table and policy) or the `router` (carries the policy and its weights).
All the work happens in the `tokenrouter` runtime library; this file only connects it to Triton.
"""

import locale

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # The stub's embedded interpreter starts in the C locale, so open() without an encoding
        # reads ASCII; libraries that read their own UTF-8 files at import (torch's inductor,
        # imported by vLLM) then fail. A UTF-8 LC_CTYPE makes it read UTF-8.
        if locale.getpreferredencoding(False).lower() not in ("utf-8", "utf8"):
            locale.setlocale(locale.LC_CTYPE, "C.UTF-8")
        from tokenrouter.serving.triton_model import create_role

        self.role = create_role(pb_utils, args)

    def execute(self, requests):
        return self.role.execute(requests)

    def finalize(self):
        self.role.finalize()

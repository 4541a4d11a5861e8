"""Triton's Python-based backend ``python_router``: ``backend: "python_router"`` in a config.pbtxt
runs this class (the launcher links this file as ``python_router/model.py``; the NGC image links
``backends/python_router/model.py``, which re-exports it).

Each model instance is a stub process. Its config.pbtxt parameter ``role`` picks the model kind
(model_kinds.py): a ``subserver`` (one model's engine, scheduler, pending table and policy) or
``routing_policy`` (carries the policy, its weights and the scheduling settings). All the work
happens in the ``tokenrouter`` runtime library; this class only connects it to Triton. It lives in
the package so that an installed tokenrouter carries its own backend.
"""

import locale


class TritonPythonModel:
    def initialize(self, args):
        # The stub's embedded interpreter starts in the C locale, so open() without an encoding
        # reads ASCII; libraries that read their own UTF-8 files at import (torch's inductor,
        # imported by vLLM) then fail. A UTF-8 LC_CTYPE makes it read UTF-8.
        if locale.getpreferredencoding(False).lower() not in ("utf-8", "utf8"):
            locale.setlocale(locale.LC_CTYPE, "C.UTF-8")
        # Only a Triton stub has this module; imported here so that the file can be found and
        # inspected outside Triton.
        import triton_python_backend_utils as pb_utils

        # absolute: Triton loads this file as `model`
        from tokenrouter.serving.subserver.model_kinds import create_triton_model

        self.model = create_triton_model(pb_utils, args)

    def execute(self, requests):
        return self.model.execute(requests)

    def finalize(self):
        self.model.finalize()

"""Triton's Python-based backend `python_router`: `backend: "python_router"` in a config.pbtxt runs this.

Each model instance is a stub process. Parameter `role` picks what it is: a `subserver` (one model's
engine, scheduler, pending table and policy) or the `router` (carries the policy and its weights).
All the work happens in the `tokenrouter` runtime library; this file only connects it to Triton.
"""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        from tokenrouter.serving.triton_model import create_role

        self.role = create_role(pb_utils, args)

    def execute(self, requests):
        return self.role.execute(requests)

    def finalize(self):
        self.role.finalize()

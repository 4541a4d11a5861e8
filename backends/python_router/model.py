"""Triton's Python-based backend ``python_router`` (see tokenrouter/serving/subserver/backend_model.py).

Triton's Python backend loads ``<backends>/python_router/model.py``; the class lives in the
installed ``tokenrouter`` package so that a non-editable install carries it too.
"""

from tokenrouter.serving.subserver.backend_model import TritonPythonModel  # noqa: F401

"""Triton's Python-based backend ``python_router`` (see tokenrouter/serving/backend_entry.py).

Triton's Python backend loads ``<backends>/python_router/model.py``; the class lives in the
installed ``tokenrouter`` package so that a non-editable install carries it too.
"""

from tokenrouter.serving.backend_entry import TritonPythonModel  # noqa: F401

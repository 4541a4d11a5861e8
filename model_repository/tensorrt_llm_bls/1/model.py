"""Triton loads this file; the model lives in the tokenrouter package."""

from tokenrouter.serving.front.front_model import TritonPythonModel  # noqa: F401

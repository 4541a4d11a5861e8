"""Triton loads this file; the model lives in the tokenrouter package."""

from tokenrouter.serving.preprocessing_model import TritonPythonModel  # noqa: F401

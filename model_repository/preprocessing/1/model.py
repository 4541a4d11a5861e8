"""Triton loads this file; the model lives in the tokenrouter package."""

from tokenrouter.serving.text.preprocessing_model import TritonPythonModel  # noqa: F401

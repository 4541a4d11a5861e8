"""Triton loads this file; the model lives in the tokenrouter package."""

from tokenrouter.serving.text.postprocessing_model import TritonPythonModel  # noqa: F401

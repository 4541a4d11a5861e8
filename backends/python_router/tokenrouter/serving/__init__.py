"""Serving on Triton: the model repository (render/read), the tensor interface, and the
preprocessing/postprocessing models. Importable without Triton except the two ``*_model`` modules,
which Triton's Python backend loads."""

"""The front models' process: what clients call (TensorRT-LLM's interface), in Triton's Python backend."""

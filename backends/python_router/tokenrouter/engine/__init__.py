"""Step-level engines: the contract, the PyTorch engine, the simulated engine."""

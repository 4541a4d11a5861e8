"""TokenRouter runtime library: engines, subservers, policies (importable without Triton)."""

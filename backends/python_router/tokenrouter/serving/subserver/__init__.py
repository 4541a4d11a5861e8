"""The python_router backend's process: a subserver (or the routing_policy model) in a Triton Python stub."""

"""Engine recipes and build/convert tools (real model pair installer, tiny test model pairs)."""

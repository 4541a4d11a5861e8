"""Importing this module registers every shipped policy."""

from . import r_stitch, simple  # noqa: F401

"""Importing this module registers every shipped policy."""

from . import citer, co_llm, ensemble, glimp, query_level, r2r, r_stitch, simple  # noqa: F401

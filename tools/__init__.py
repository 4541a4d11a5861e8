"""Operator tools: the `tokenrouter` command, serve launcher, repository builder, benchmarks."""

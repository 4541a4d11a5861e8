"""The launcher: the `tokenrouter` command, `tokenrouter serve` and what it runs (the supervisor, the
tritonserver process, the repository builder) and the paths it finds its files by."""

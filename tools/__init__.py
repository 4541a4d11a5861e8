"""Developer tools: benchmarks, the quality bench, router training, plots, the GPU check. The `tokenrouter`
command (tokenrouter.launch.cli) runs their subcommands; the product (`tokenrouter serve`) does not import them."""

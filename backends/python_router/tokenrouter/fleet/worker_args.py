"""The command-line options every Dynamo worker that serves the pair's OpenAI model takes (the whole
pair's worker, engine.py, and the split pair's entry, entry_engine.py)."""

from __future__ import annotations

import argparse
import os


def add_served_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="the pair's YAML config (configs/)")
    parser.add_argument("--served-model-name", default="tokenrouter")
    parser.add_argument("--model-path", help="folder the frontend reads the tokenizer, chat template and "
                                             "generation config from (default: the config's tokenizer)")
    parser.add_argument("--namespace", default=os.environ.get("DYN_NAMESPACE", "tokenrouter"))

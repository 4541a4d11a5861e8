"""``python -m tokenrouter.openai_server``: the OpenAI-compatible server on uvicorn.

SIGTERM or Ctrl-C: it stops taking connections and gives the requests in flight up to
``--drain-timeout`` seconds to finish (uvicorn's graceful shutdown), as Triton drains beside it.
Its HTTP limits (head size, URL length, slow clients, connections) are http_limits.py's.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import uvicorn

from .app import API_KEY_ENV, API_KEY_FILE_ENV, create_app, read_api_key
from .http_limits import server_config
from .served import ServedPair


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-repository", required=True, type=Path, help="the TokenRouter repository Triton serves")
    parser.add_argument("--triton-url", default="127.0.0.1:8001", help="Triton's gRPC address (default 127.0.0.1:8001)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--api-key-file", type=Path, default=os.environ.get(API_KEY_FILE_ENV), metavar="PATH",
                        help=f"require 'Authorization: Bearer <key>' on /v1, the key read from PATH (default: "
                             f"${API_KEY_FILE_ENV}, else the key in ${API_KEY_ENV}; neither: open)")
    parser.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                        help="on SIGTERM: seconds the requests in flight get to finish (default 30)")
    parser.add_argument("--log-level", default="warning")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tokenrouter.openai_server", description=__doc__)
    configure(parser)
    args = parser.parse_args(argv)
    try:
        api_key = read_api_key(args.api_key_file)
    except ValueError as err:
        parser.error(str(err))
    app = create_app(ServedPair.from_repository(args.model_repository), args.triton_url, api_key)
    uvicorn.Server(server_config(app, args.host, args.port, drain_timeout_s=args.drain_timeout,
                                 log_level=args.log_level)).run()


if __name__ == "__main__":
    main()

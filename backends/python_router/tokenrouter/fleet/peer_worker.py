"""A peer of a split pair as a Dynamo worker: one model's subserver (the large model), reached only by
the other workers' links (pool_member.py), never by the frontend.

    python -m tokenrouter.fleet.peer_worker --config C --model llm

SIGTERM or SIGINT stops it: its subserver ends what it holds (the entry's requests away here end with
an error there, when the entry's link gives the session up).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal

from dynamo._core import DistributedRuntime

from .pool_member import PoolMember

log = logging.getLogger(__name__)


async def serve(config: str, model: str, namespace: str) -> None:
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"),
                                 os.environ.get("DYN_REQUEST_PLANE", "tcp"))
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    member = await PoolMember.start(config, model, runtime, namespace, on_death=lambda: _exit(model))
    log.info("peer worker for '%s' serving", model)
    try:
        await stop.wait()
    finally:
        await loop.run_in_executor(None, member.close)
        runtime.shutdown()


def _exit(model: str) -> None:
    log.critical("the subserver loop of '%s' died: the worker exits", model)
    os._exit(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tokenrouter.fleet.peer_worker",
                                     description="one peer model of a split pair as a Dynamo worker")
    parser.add_argument("--config", required=True, help="the pair's YAML config (configs/)")
    parser.add_argument("--model", required=True, help="which of the config's models this worker runs")
    parser.add_argument("--namespace", default=os.environ.get("DYN_NAMESPACE", "tokenrouter"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(args.config, args.model, args.namespace))


if __name__ == "__main__":
    main()

"""One replica of the pair as a Dynamo worker: ``python -m tokenrouter.fleet.worker --config C``."""

from dynamo.common.backend.run import run

from .engine import TokenRouterEngine

if __name__ == "__main__":
    run(TokenRouterEngine)

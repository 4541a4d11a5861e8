"""Past one pair: replicas of the pair behind NVIDIA Dynamo (docs/deploy.md, "Fleet").

``engine``: the pair as a Dynamo engine (one worker = one whole pair); ``pair_process``: the worker's
side of the pair's child process, ``pair_host``: that process (every model's subserver loops),
``frames``: the messages between them; ``requests``: a Dynamo request made into the embedded API's
keywords; ``worker``: the worker process; ``launcher``: ``tokenrouter fleet``, a frontend and N
workers on one machine."""

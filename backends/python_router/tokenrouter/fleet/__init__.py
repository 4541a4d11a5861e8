"""Past one pair: replicas of the pair behind NVIDIA Dynamo (docs/deploy.md, "Fleet").

``engine``: the embedded runtime as a Dynamo engine (one worker = one whole pair); ``requests``: a
Dynamo request made into the embedded API's keywords; ``worker``: the worker process; ``launcher``:
``tokenrouter fleet``, a frontend and N workers on one machine."""

"""Past one pair: replicas of the pair, and the pair split over workers, behind NVIDIA Dynamo
(docs/deploy.md, "Fleet").

Replicas (one worker = one whole pair): ``engine``: the pair as a Dynamo engine; ``pair_process``: the
worker's side of the pair's child process, ``pair_host``: that process (every model's subserver loops),
``pair_messages``: the messages between them, ``frames``: how they are framed; ``worker``: the worker process.

The split pair (``--pools M+K``): ``entry_engine``: an entry worker (small model and policy, the served
model); ``peer_worker``: a large-model worker; ``pool_member``: a subserver of either as a pool member
(its links, its receiving end); ``pinned_transport``: a worker's links to the other model's pool, each
request pinned to one instance; ``entry_owners``: at a peer, the entry instance that owns each request;
``kv_share``: the peer KV each of M entries admits against; ``dynamo_channel``: the peer session's
channel over Dynamo's worker-to-worker calls.

Both: ``requests``: a Dynamo request made into the embedded API's keywords; ``streamed_output``: one
request's output as ``generate`` reads it; ``response_chunks``: the chunks ``generate`` yields for it;
``worker_args``: the options of a worker that serves the model; ``launcher``: ``tokenrouter fleet``, a
frontend and its workers on one machine."""

"""Test double of a TokenRouter *subserver* (not of Triton): a real Triton Python model with the
subserver tensor interface and fixed behaviour, so that the fronts, streaming, HTTP generate and
the standalone pre/postprocessing are proven against a real server without an engine.

Behaviour: the "generated" tokens are the prompt's own tokens, in order, until ``max_tokens``
(finish "length"), an id in ``end_id`` (finish "eos", the id itself not emitted), the end of
the prompt (finish "eos") or a completed stop sequence from ``stop_ids`` (finish "stop", the
sequence emitted). Token i is attributed to "echo_large" when i % 3 == 2, else "echo_small", and
has the log probability -(i + 1) / 8 when ``return_log_probs`` is set. When streaming, every token
is its own response (the hardest case for UTF-8 safety), with FINAL sent on the last data
response as the real subserver must. A ``control`` request (a front's cancel) is answered
with an empty FINAL.
"""

import triton_python_backend_utils as pb_utils

from tokenrouter.serving.text.detokenize import prefix_window
from tokenrouter.serving.subserver.output_chunk import OutputChunk
from tokenrouter.serving.schema import split_sequences

SMALL, LARGE = "echo_small", "echo_large"


def _ints(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else [int(v) for v in tensor.as_numpy().reshape(-1)]


def echo(prompt, max_tokens, end_ids, stops):
    """(tokens, finish_reason) of the fixed behaviour described in the module docstring."""
    out = []
    for token in prompt:
        if len(out) == max_tokens:
            return out, "length"
        if token in end_ids:
            return out, "eos"
        out.append(token)
        if any(out[-len(seq):] == seq for seq in stops):
            return out, "stop"
    return out, "length" if len(out) == max_tokens else "eos"


def _response(tokens, start, end, finish, logprobs):
    models = [LARGE if i % 3 == 2 else SMALL for i in range(end)]
    chunk = OutputChunk(tokens[start:end], [m.encode() for m in models[start:end]], prefix_window(tokens, start),
                        finish, models.count(LARGE) / end if end else 0.0,
                        [-(i + 1) / 8 for i in range(start, end)] if logprobs else [])
    return pb_utils.InferenceResponse([pb_utils.Tensor(name, array) for name, array in chunk.tensors().items()])


class TritonPythonModel:
    def execute(self, requests):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request in requests:
            sender = request.get_response_sender()
            if pb_utils.get_input_tensor_by_name(request, "control") is not None:
                sender.send(flags=final)
                continue
            tokens, finish = echo(_ints(request, "input_ids", []), _ints(request, "max_tokens", [16])[0],
                                  set(_ints(request, "end_id", [])), split_sequences(_ints(request, "stop_ids", [])))
            logprobs = bool(_ints(request, "return_log_probs", [0])[0])
            stream = bool(_ints(request, "stream", [0])[0])
            if stream and tokens:
                for i in range(len(tokens)):
                    last = i == len(tokens) - 1
                    sender.send(_response(tokens, i, i + 1, finish if last else None, logprobs),
                                flags=final if last else 0)
            else:
                sender.send(_response(tokens, 0, len(tokens), finish, logprobs), flags=final)
        return None

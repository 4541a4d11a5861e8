"""Test double of a TokenRouter *subserver* (not of Triton): a real Triton Python model with the
subserver tensor interface and fixed behaviour, so that preprocessing, postprocessing, the
ensemble, streaming and HTTP generate are proven against a real server without an engine.

Behaviour: the "generated" tokens are the prompt's own tokens, in order, until ``max_tokens``
(finish "length"), an id in ``end_id`` (finish "eos", the id itself not emitted), the end of
the prompt (finish "eos") or a completed stop sequence from ``stop_ids`` (finish "stop", the
sequence emitted). Token i is attributed to "echo_large" when i % 3 == 2, else "echo_small".
When streaming, every token is its own response (the hardest case for UTF-8 safety), with FINAL
sent on the last data response as the real subserver must.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

from tokenrouter.serving.detokenize import prefix_window

SMALL, LARGE = "echo_small", "echo_large"


def _ints(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else [int(v) for v in tensor.as_numpy().reshape(-1)]


def _stop_sequences(flat):
    sequences, current = [], []
    for token in flat:
        if token == -1:
            sequences.append(current)
            current = []
        else:
            current.append(token)
    return [seq for seq in sequences if seq]


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


def _response(tokens, start, end, finish, is_final):
    models = [LARGE if i % 3 == 2 else SMALL for i in range(end)]
    share = models.count(LARGE) / end if end else 0.0
    return pb_utils.InferenceResponse([
        pb_utils.Tensor("output_ids", np.array([tokens[start:end]], dtype=np.int32).reshape(1, -1)),
        pb_utils.Tensor("prefix_ids", np.array([prefix_window(tokens, start)], dtype=np.int32).reshape(1, -1)),
        pb_utils.Tensor("output_models", np.array([[m.encode() for m in models[start:end]]], dtype=object).reshape(1, -1)),
        pb_utils.Tensor("finish_reason", np.array([[finish.encode()]], dtype=object)),
        pb_utils.Tensor("large_model_share", np.array([[share]], dtype=np.float32)),
        pb_utils.Tensor("is_final", np.array([[is_final]], dtype=bool)),
    ])


class TritonPythonModel:
    def execute(self, requests):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request in requests:
            sender = request.get_response_sender()
            tokens, finish = echo(_ints(request, "input_ids", []), _ints(request, "max_tokens", [16])[0],
                                  set(_ints(request, "end_id", [])), _stop_sequences(_ints(request, "stop_ids", [])))
            stream = pb_utils.get_input_tensor_by_name(request, "stream")
            if stream is not None and bool(stream.as_numpy().reshape(-1)[0]) and tokens:
                for i in range(len(tokens)):
                    last = i == len(tokens) - 1
                    sender.send(_response(tokens, i, i + 1, finish if last else "", last), flags=final if last else 0)
            else:
                sender.send(_response(tokens, 0, len(tokens), finish, True), flags=final)
        return None

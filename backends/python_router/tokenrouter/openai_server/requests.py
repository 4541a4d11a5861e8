"""OpenAI request bodies, read and checked: what is supported, what is refused by name.

Pydantic models with ``extra="forbid"``: an unknown parameter is refused as OpenAI refuses it
("Unrecognized request argument"). Strict types, as OpenAI checks them: a string where a number or
a boolean is due is refused, not coerced (an integer is a number, a number is not an integer).
Every integer is bounded to what the fronts' INT32 inputs hold, so nothing wraps on the way.
Parameters OpenAI has and we do not serve are refused with why (``REFUSED``), unless sent at the
value that switches them off. Every error names its parameter (errors.py turns it into a 400).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import OpenAIError, bad_request

NO_TOOLS = "tool and function calling is not supported: the routed models answer in text"
# parameter -> (accepted when, why not otherwise)
REFUSED: dict[str, tuple[Any, str]] = {
    "tools": (lambda v: not v, NO_TOOLS),
    "tool_choice": (lambda v: v in (None, "none"), NO_TOOLS),
    "functions": (lambda v: not v, NO_TOOLS),
    "function_call": (lambda v: v in (None, "none"), NO_TOOLS),
    "response_format": (lambda v: v is None or (isinstance(v, dict) and v.get("type") == "text"),
                        "only {\"type\": \"text\"}: JSON mode and structured outputs need guided decoding, "
                        "which is not implemented"),
    "logit_bias": (lambda v: not v, "not mapped: a bias on token ids of one model's vocabulary"),
    "suffix": (lambda v: not v, "insertion (a suffix) is not supported"),
    "audio": (lambda v: v is None, "the routed models take and write text"),
    "modalities": (lambda v: v in (None, ["text"]), "the routed models take and write text"),
    "prediction": (lambda v: v is None, "predicted outputs are not supported"),
    "reasoning_effort": (lambda v: v is None, "not a reasoning model"),
    "web_search_options": (lambda v: v is None, "web search is not supported"),
    "store": (lambda v: not v, "completions are not stored"),
}


def parse(model: type[BaseModel], body: Any) -> Any:
    """``body`` (decoded JSON) as ``model``, or the OpenAIError that names what is wrong."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    for name, (accepted, why) in REFUSED.items():
        if name in body and name in model.model_fields and not accepted(body[name]):
            raise bad_request(f"{name} is not supported: {why}", param=name, code="unsupported_parameter")
    try:
        return model.model_validate(body)
    except ValidationError as invalid:
        errors = invalid.errors()
        error = errors[0]
        param = ".".join(str(part) for part in error["loc"]) or None
        if error["type"] == "extra_forbidden":
            raise bad_request(f"Unrecognized request argument supplied: {param}", param=param,
                              code="unrecognized_argument") from None
        # OpenAI's wording of a wrong type, unless the parameter has several errors (each alternative of
        # a union fails on its own: "a string" alone would be misleading)
        if error["type"] in EXPECTED and sum(e["loc"][:1] == error["loc"][:1] for e in errors) == 1:
            raise bad_request(f"Invalid type for '{param}': expected {EXPECTED[error['type']]}, but got "
                              f"{_json_kind(error['input'])} instead.", param=param, code="invalid_type") from None
        message = str(error["ctx"]["error"]) if error["type"] == "value_error" else error["msg"]
        raise bad_request(f"{param}: {message}", param=param) from None


# pydantic's strict type errors -> what OpenAI says was expected
EXPECTED = {"int_type": "an integer", "float_type": "a number", "bool_type": "a boolean", "string_type": "a string",
            "list_type": "an array", "dict_type": "an object", "model_type": "an object"}


def _json_kind(value: Any) -> str:
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a decimal number"), (str, "a string"),
                       (list, "an array"), (dict, "an object")):
        if isinstance(value, kind):
            return name
    return "null"


def lone_surrogate_path(value: Any, path: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
    """Where in decoded JSON a string holds a lone surrogate (JSON's "\\ud800" escape decodes to one,
    and no UTF-8 encoder takes it), or None. Keys are checked too: an unknown one is echoed back."""
    if isinstance(value, str):
        return None if value.isascii() or not _has_lone_surrogate(value) else path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and _has_lone_surrogate(key):
            return (*path, key.encode("utf-8", "backslashreplace").decode())
        if (found := lone_surrogate_path(item, (*path, key))) is not None:
            return found
    return None


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


INT32_MAX = 2**31 - 1  # the fronts' integer inputs (max_tokens, top_k, min_tokens, ...) are INT32


def integer_in(low: int, high: int = INT32_MAX) -> AfterValidator:
    """Refuses an integer field outside [low, high], the message naming the range (``Annotated[int, ...]``:
    written out at each alias, so that the type checker reads the alias as a type)."""
    def check(value: int) -> int:
        if not low <= value <= high:
            raise ValueError(f"{value} is out of range: expected an integer from {low} to {high}")
        return value
    return AfterValidator(check)


AtLeastOne = Annotated[int, integer_in(1)]
NonNegative = Annotated[int, integer_in(0)]
FP32_MAX = 3.4028234663852886e38  # the fronts' float inputs are FP32: a larger number would arrive as inf


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's extension: the usage so far in every chunk
    include_obfuscation: bool = False  # OpenAI's padding against length side channels: not sent here, accepted


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[TextPart]]
    name: str | None = None

    @field_validator("role", mode="before")
    @classmethod
    def _no_tool_turns(cls, role: Any) -> Any:
        if role in ("tool", "function"):
            raise ValueError(f"'{role}' messages are not supported: {NO_TOOLS}")
        return role

    def as_template_turn(self) -> dict[str, str]:
        """The turn the chat template reads (OpenAI's developer role is the system role here)."""
        text = self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Seed = Annotated[int, integer_in(-(2**63), 2**64 - 1)]


class _Sampling(_Strict):
    """What chat and completions share."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: AtLeastOne = 1
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: Probability = 1.0
    seed: Seed | None = None
    stop: Union[str, list[str], None] = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    user: str | None = None
    # vLLM's extensions of OpenAI's API, which the fronts serve (TensorRT-LLM's inputs of those names)
    top_k: NonNegative = 0
    min_tokens: NonNegative = 0
    ignore_eos: bool = False  # vLLM's: do not stop at an end id (min_tokens = max_tokens)
    repetition_penalty: float = Field(1.0, gt=0.0, le=FP32_MAX)
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    # refused unless off (REFUSED)
    logit_bias: dict[str, float] | None = None

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not stop for stop in stops):
            raise bad_request("stop: an empty stop sequence would end every reply at once", param="stop")
        return stops


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_tokens: AtLeastOne | None = None
    max_completion_tokens: AtLeastOne | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # refused unless off (REFUSED)
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None  # meaningless without tools: accepted
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    reasoning_effort: str | None = None
    web_search_options: Any = None
    store: bool | None = None

    def output_cap(self) -> int | None:
        """max_completion_tokens (the current name), else max_tokens; None: up to the context."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def check(self) -> None:
        if self.top_logprobs:
            raise bad_request("top_logprobs > 0 is not supported: the engines return the log probability of the "
                              "sampled token only (logprobs: true)", param="top_logprobs", code="unsupported_parameter")


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str]]
    max_tokens: AtLeastOne = 16  # OpenAI's default for completions
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    best_of: AtLeastOne | None = None
    # refused unless off (REFUSED)
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _text_prompts(cls, prompt: Any) -> Any:
        if isinstance(prompt, list) and prompt and not all(isinstance(p, str) for p in prompt):
            raise ValueError("prompts as token ids are not supported: send text (a string or a list of strings)")
        if prompt == [] or prompt == "":
            raise ValueError("the prompt is empty")
        return prompt

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def check(self) -> None:
        if self.logprobs:
            raise bad_request("logprobs > 0 is not supported: the engines return the log probability of the sampled "
                              "token only (logprobs: 0)", param="logprobs", code="unsupported_parameter")
        if self.echo and self.logprobs is not None:
            raise bad_request("echo with logprobs is not supported: the prompt's log probabilities are not computed",
                              param="echo", code="unsupported_parameter")
        if self.best_of not in (None, self.n):
            raise bad_request(f"best_of {self.best_of} is not supported: only best_of = n ({self.n}); candidates "
                              "are not ranked here", param="best_of", code="unsupported_parameter")


def limit_choices(n: int, prompts: int, max_choices: int, max_generations: int) -> None:
    if n > max_choices:
        raise bad_request(f"n {n} is over the limit of {max_choices} (frontend.max_return_sequences)", param="n")
    if n * prompts > max_generations:
        raise bad_request(f"{prompts} prompts x n {n} make {n * prompts} generations; the limit is {max_generations} "
                          "(frontend.max_generations)", param="n")


def model_not_found(name: str, served: tuple[str, ...]) -> OpenAIError:
    return OpenAIError(404, f"The model '{name}' does not exist; this server serves {', '.join(served)}",
                       param="model", code="model_not_found")

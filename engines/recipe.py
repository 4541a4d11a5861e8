"""Model-pair recipes: which pinned wheels hold which GGUF, and the digests that vouch for it.

A recipe is plain YAML (see recipes/qwen2.5-coder-pair.yaml); this module turns it into frozen
dataclasses and rejects anything malformed before a single byte is downloaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
DEFAULT_RECIPE = RECIPES_DIR / "qwen2.5-coder-pair.yaml"

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_DTYPES = ("float32", "float16", "bfloat16")


class InstallError(Exception):
    """Anything that stops a model install; the message says what to do about it."""


class RecipeError(InstallError):
    """The recipe file itself is wrong."""


@dataclass(frozen=True)
class Part:
    """One chunk of a GGUF, shipped as the data file `path_in_wheel` inside the wheel `package==version`."""

    index: int
    package: str
    version: str
    path_in_wheel: str  # the recipe's `member` (a zip archive's word for one of its files)
    size: int
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        # Wheel file names use the normalized project name (PEP 427/503): runs of -_. become "_".
        return f"{re.sub(r'[-_.]+', '_', self.package).lower()}-{self.version}-"


@dataclass(frozen=True)
class ModelRecipe:
    """One model of the pair: its parts in join order and the digest of the joined GGUF."""

    member: str  # its place in the pair: the recipe's key under `models` (small, large)
    name: str
    parts: tuple[Part, ...]
    size: int
    sha256: str
    converted_bytes: int

    @property
    def gguf_filename(self) -> str:
        return f"{self.name}.gguf"

    @property
    def source_label(self) -> str:
        """Human name of the package set, for error messages."""
        first, last = self.parts[0], self.parts[-1]
        return f"{first.package}..{last.package}=={first.version}"


@dataclass(frozen=True)
class PairRecipe:
    name: str
    dtype: str
    eos_tokens: tuple[str, ...]
    pad_token: str
    models: dict[str, ModelRecipe]


def load_recipe(path: Path = DEFAULT_RECIPE) -> PairRecipe:
    """Parse and validate a pair recipe."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise RecipeError(f"cannot read recipe {path}: {error}") from error
    return parse_recipe(raw, source=str(path))


def parse_recipe(raw: Any, source: str = "<recipe>") -> PairRecipe:
    """Validate an already-parsed recipe mapping (split out so tests can feed dicts)."""
    where = f"recipe {source}"
    top = _mapping(raw, where)
    dtype = _field(top, "dtype", str, where)
    if dtype not in _DTYPES:
        raise RecipeError(f"{where}: dtype must be one of {_DTYPES}, got {dtype!r}")
    eos = _field(top, "eos_tokens", list, where)
    if not eos or not all(isinstance(token, str) for token in eos):
        raise RecipeError(f"{where}: eos_tokens must be a non-empty list of token strings")
    models_raw = _mapping(_field(top, "models", dict, where), f"{where}: models")
    if not models_raw:
        raise RecipeError(f"{where}: models is empty")
    models = {member: _parse_model(member, spec, f"{where}: models.{member}") for member, spec in models_raw.items()}
    names = [model.name for model in models.values()]
    if len(set(names)) != len(names):
        raise RecipeError(f"{where}: model names must be distinct, got {names}")
    return PairRecipe(
        name=_field(top, "name", str, where),
        dtype=dtype,
        eos_tokens=tuple(eos),
        pad_token=_field(top, "pad_token", str, where),
        models=models,
    )


def _parse_model(member: str, raw: Any, where: str) -> ModelRecipe:
    spec = _mapping(raw, where)
    package = _field(spec, "package", str, where)
    path_in_wheel = _field(spec, "member", str, where)
    version = str(_field(spec, "version", (str, int, float), where))
    name = _field(spec, "name", str, where)
    if "/" in name or name.startswith("."):
        raise RecipeError(f"{where}: name {name!r} must be a plain directory name")
    parts_raw = _field(spec, "parts", list, where)
    if not parts_raw:
        raise RecipeError(f"{where}: parts is empty")
    parts = tuple(_parse_part(n, package, version, path_in_wheel, entry, f"{where}.parts[{n - 1}]")
                  for n, entry in enumerate(parts_raw, start=1))
    size = _positive(spec, "size", where)
    if sum(part.size for part in parts) != size:
        raise RecipeError(f"{where}: part sizes add up to {sum(p.size for p in parts)}, not size {size}")
    return ModelRecipe(
        member=member,
        name=name,
        parts=parts,
        size=size,
        sha256=_digest(spec, where),
        converted_bytes=_positive(spec, "converted_bytes", where),
    )


def _parse_part(n: int, package: str, version: str, path_in_wheel: str, raw: Any, where: str) -> Part:
    spec = _mapping(raw, where)
    try:
        package_n, path_n = package.format(n=n), path_in_wheel.format(n=n)
    except (KeyError, IndexError, ValueError) as error:
        raise RecipeError(f"{where}: bad package/member template ({error}); only {{n}} is defined") from error
    return Part(index=n, package=package_n, version=version, path_in_wheel=path_n,
                size=_positive(spec, "size", where), sha256=_digest(spec, where))


def _mapping(raw: Any, where: str) -> dict:
    if not isinstance(raw, dict):
        raise RecipeError(f"{where}: expected a mapping, got {type(raw).__name__}")
    return raw


def _field(spec: dict, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in spec:
        raise RecipeError(f"{where}: missing {key!r}")
    value = spec[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise RecipeError(f"{where}: {key!r} has the wrong type ({type(value).__name__})")
    return value


def _positive(spec: dict, key: str, where: str) -> int:
    value = _field(spec, key, int, where)
    if value <= 0:
        raise RecipeError(f"{where}: {key!r} must be positive, got {value}")
    return value


def _digest(spec: dict, where: str) -> str:
    value = _field(spec, "sha256", str, where)
    if not _SHA256.match(value):
        raise RecipeError(f"{where}: sha256 must be 64 lowercase hex digits, got {value!r}")
    return value

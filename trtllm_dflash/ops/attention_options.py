"""The options of the attention plugins, each declared once.

An attention option is a per-layer setting of an attention op: the softmax scale, a sliding window,
attention sinks (gpt-oss). Each is one row of `BLOCK_ATTENTION` or `TARGET_ATTENTION` below, and
every layer between a model and the kernel derives its handling of the option from the row:

- `ops`, `custom_ops`: the arguments of the Python entry points and of the `dflash::` op schemas;
- `onnx_nodes`: the node's extra inputs (tensor options) and attributes, their evaluation and export;
- `tensorrt_plugins`: the plugin's TensorDesc inputs and fields, and the launch planned from them;
- `kernels.launch`: the kernel's pointers, int32 scalars and constexprs;
- `aot_variants`: the kernel signature and the constexprs that key a compiled variant.

So adding an option is a row here, its semantics in `reference_attention.py` and its use in the kernel
(`kernels/attention.py`). Two kinds:

- `ScalarOption`: a number per layer. ONNX attribute and TensorRT plugin field of the same name,
  a `float`/`int` op argument, an int32 kernel scalar (a float travels as its bits). A runtime value:
  one compiled kernel serves every value.
- `TensorOption`: an optional float32 tensor per layer (sinks `[Hq]`). An ONNX input that is a
  placeholder unless the int attribute `has_<name>` is 1 (also a TensorRT field), a `Tensor?` op
  argument, a `*fp32` kernel pointer read only under the constexpr `HAS_<NAME>`. Its presence is a
  key of the compiled variants, so the kernel space (`aot_variants.KernelSpace`) needs an axis for it.

Order: rows are in kernel-parameter order (pointers after the op's own inputs, scalars where the
kernel's scalar list has its options). Python arguments put the required options first, as Python
must: `target_attention(q, ..., starts, sinks, scale, window=0)`.

This module imports neither torch nor TensorRT: the callers pass their tensor type in.
"""

from __future__ import annotations

import dataclasses
import inspect
import struct
from typing import Callable, Mapping, Optional


def float_bits(value: float) -> int:
    """The int32 bit pattern of a float32 (plugin scalars are integers; the kernel bitcasts back)."""
    return struct.unpack("<i", struct.pack("<f", float(value)))[0]


@dataclasses.dataclass(frozen=True)
class ScalarOption:
    """A number per layer: ONNX attribute, TensorRT field, op argument and int32 kernel scalar."""

    name: str
    type: type  # float or int
    default: float | int  # when not given (ONNX attribute, TensorRT field, optional argument)
    required: bool = False  # the Python argument has no default: every caller chooses
    kernel_param: str = ""  # the kernel's parameter name, when it is not `name`

    @property
    def kernel_name(self) -> str:
        return self.kernel_param or self.name

    def kernel_value(self, value) -> int:
        """The int32 the kernel takes (floats as their bits, bitcast back in the kernel)."""
        return float_bits(value) if self.type is float else int(value)


@dataclasses.dataclass(frozen=True)
class TensorOption:
    """An optional float32 tensor per layer: op argument, ONNX input + `has_<name>`, kernel pointer + `HAS_<NAME>`."""

    name: str
    shape: Callable[[tuple], tuple]  # its expected shape, from q's shape [b, T, Hq, D]
    required: bool = False  # the Python argument has no default (it may still be None)

    dtype = "float32"  # what the kernel reads; exporters and launches cast to it

    @property
    def flag(self) -> str:
        """The ONNX attribute / TensorRT field saying whether the input is real (1) or a placeholder (0)."""
        return f"has_{self.name}"

    @property
    def constexpr(self) -> str:
        return f"HAS_{self.name.upper()}"

    @property
    def kernel_name(self) -> str:
        return f"{self.name}_ptr"


Option = ScalarOption | TensorOption


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
    """The options of one attention op, in kernel-parameter order."""

    op: str
    rows: tuple[Option, ...]

    @property
    def tensors(self) -> tuple[TensorOption, ...]:
        return tuple(o for o in self.rows if isinstance(o, TensorOption))

    @property
    def scalars(self) -> tuple[ScalarOption, ...]:
        return tuple(o for o in self.rows if isinstance(o, ScalarOption))

    @property
    def call_order(self) -> tuple[Option, ...]:
        """Python argument order: the required options first, then those with defaults."""
        return tuple(o for o in self.rows if o.required) + tuple(o for o in self.rows if not o.required)

    # ------------------------------------------------------------------ Python arguments

    def parameters(self, tensor: object) -> list[inspect.Parameter]:
        """The options as parameters after an op's own: `tensor | None` (unannotated for tensor=None)
        / `float` / `int`, the optional ones with their defaults (so a new option with a default
        changes no caller)."""
        params = []
        for option in self.call_order:
            if isinstance(option, TensorOption):
                annotation = Optional[tensor] if tensor is not None else inspect.Parameter.empty
                default = None
            else:
                annotation, default = option.type, option.default
            params.append(
                inspect.Parameter(
                    option.name,
                    inspect.Parameter.POSITIONAL_OR_KEYWORD,
                    annotation=annotation,
                    default=inspect.Parameter.empty if option.required else default,
                )
            )
        return params

    def takes_options(self, tensor: object) -> Callable:
        """Decorate `fn(<the op's own parameters>, [*, keyword-only ones], **options)` to take this op's
        options after its own positional parameters.

        The result has the full signature (what `torch.library.custom_op`, `help()` and callers see);
        a call binds positional and keyword arguments, fills the defaults, casts scalars to their type
        and passes the options to `fn` by name, in call order.
        """

        def decorate(fn: Callable) -> Callable:
            own = inspect.signature(fn, eval_str=True)  # real types: the wrapper has other globals
            positional = [p for p in own.parameters.values() if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
            keyword = [p for p in own.parameters.values() if p.kind == inspect.Parameter.KEYWORD_ONLY]
            signature = inspect.Signature(positional + self.parameters(tensor) + keyword, return_annotation=own.return_annotation)
            scalars = {o.name: o.type for o in self.scalars}
            names = list(signature.parameters)
            fallback = {n: p.default for n, p in signature.parameters.items() if p.default is not inspect.Parameter.empty}

            keyword_defaults = {p.name: p.default for p in keyword}
            positional_count = len(names) - len(keyword)
            if any(p.default is inspect.Parameter.empty for p in keyword):
                positional_count = -1  # no fast path

            def call(*args, **kwargs):
                # binds by hand: Signature.bind costs ~10x more, on every layer of every step
                if kwargs or len(args) != positional_count:
                    args = _bind(signature, names, fallback, args, kwargs)
                arguments = dict(zip(names, args))
                if len(args) == positional_count:
                    arguments.update(keyword_defaults)
                for name, cast in scalars.items():
                    arguments[name] = cast(arguments[name])
                return fn(**arguments)

            return with_signature(call, signature, like=fn)

        return decorate

    def check_shapes(self, given: Mapping, q_shape: tuple, error: Callable[[str], Exception]) -> None:
        """Raise `error(message)` for a tensor option whose shape is not what q's shape implies."""
        for option in self.tensors:
            value = given.get(option.name)
            expected = tuple(option.shape(tuple(q_shape)))
            if value is not None and tuple(value.shape) != expected:
                raise error(f"{option.name} has shape {tuple(value.shape)}, expected {expected}")

    # ------------------------------------------------------------------ ONNX nodes and TensorRT plugins

    @property
    def input_names(self) -> tuple[str, ...]:
        """The node inputs after the op's own: one per tensor option."""
        return tuple(o.name for o in self.tensors)

    def attributes(self) -> dict:
        """ONNX attributes (== TensorRT plugin fields) with their defaults: the scalars, then the flags."""
        scalars = {o.name: o.default for o in self.call_order if isinstance(o, ScalarOption)}
        return {**scalars, **{o.flag: 0 for o in self.tensors}}

    def attribute_values(self, values: Mapping) -> dict:
        """The ONNX attributes of a call with these option values: scalars by type, flags by presence."""
        scalars = {o.name: o.type(values.get(o.name, o.default)) for o in self.call_order if isinstance(o, ScalarOption)}
        return {**scalars, **self.flags(self.present(values))}

    def present(self, given: Mapping) -> dict[str, bool]:
        """Which tensor options are real, from op arguments (a tensor or None)."""
        return {o.name: given.get(o.name) is not None for o in self.tensors}

    def present_in(self, attributes: Mapping) -> dict[str, bool]:
        """Which tensor options are real, from ONNX attributes / TensorRT fields (`has_<name>`)."""
        return {o.name: bool(int(attributes.get(o.flag, 0))) for o in self.tensors}

    def flags(self, present: Mapping[str, bool]) -> dict[str, int]:
        """The `has_<name>` attributes for the tensor options present."""
        return {o.flag: int(bool(present.get(o.name))) for o in self.tensors}

    # ------------------------------------------------------------------ kernels

    def kernel_scalars(self, given: Mapping) -> tuple[int, ...]:
        """The options' int32 kernel scalars, in kernel order, from values or attributes by name."""
        return tuple(o.kernel_value(given.get(o.name, o.default)) for o in self.scalars)

    def kernel_constexprs(self, present: Mapping[str, bool]) -> dict[str, bool]:
        """`HAS_<NAME>` per tensor option: a compile-time key of the kernel variant."""
        return {o.constexpr: bool(present.get(o.name)) for o in self.tensors}

    def kernel_pointer_params(self) -> tuple[tuple[str, str], ...]:
        """The options' pointer parameters (after the op's own inputs), as (name, Triton type)."""
        return tuple((o.kernel_name, "*fp32") for o in self.tensors)

    def kernel_scalar_params(self) -> tuple[tuple[str, str], ...]:
        """The options' int32 scalar parameters, in kernel order, as (name, Triton type)."""
        return tuple((o.kernel_name, "i32") for o in self.scalars)


def _bind(signature: inspect.Signature, names: list[str], defaults: dict, args: tuple, kwargs: dict) -> tuple:
    """All arguments in signature order, defaults filled; the TypeError Python would raise otherwise."""
    given = dict(zip(names, args), **kwargs)
    if len(args) > len(names) or len(given) < len(args) + len(kwargs) or not given.keys() <= set(names):
        signature.bind(*args, **kwargs)  # raises
    missing = [name for name in names if name not in given and name not in defaults]
    if missing:
        signature.bind(*args, **kwargs)  # raises
    return tuple(given[name] if name in given else defaults[name] for name in names)


def with_signature(call: Callable, signature: inspect.Signature, like: Callable | None = None) -> Callable:
    """`call` presenting `signature` to introspection (torch schemas, TensorRT, onnxscript, help())."""
    if like is not None:
        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(call, attribute, getattr(like, attribute))
    call.__signature__ = signature
    call.__annotations__ = {p.name: p.annotation for p in signature.parameters.values() if p.annotation is not inspect.Parameter.empty}
    if signature.return_annotation is not inspect.Signature.empty:
        call.__annotations__["return"] = signature.return_annotation
    return call


def _per_query_head(q_shape: tuple) -> tuple:
    return (q_shape[2],)


SCALE = ScalarOption("scale", float, 1.0, required=True, kernel_param="scale_bits")
# The target's window (causal): a query at p sees keys in (p - w, p]; 0: every earlier key.
WINDOW = ScalarOption("window", int, 0)
# The drafter's window and causal flag: `draft_window.DraftWindow` (never causal unless `causal` is 1;
# a window w > 0 is symmetric, |p - j| < w, over context and block keys alike).
DRAFT_WINDOW = ScalarOption("window", int, 0)
DRAFT_CAUSAL = ScalarOption("causal", int, 0)
SINKS = TensorOption("sinks", _per_query_head, required=True)  # gpt-oss: one extra logit per query head

BLOCK_ATTENTION = AttentionOptions("block_attention", (DRAFT_WINDOW, DRAFT_CAUSAL, SCALE))
TARGET_ATTENTION = AttentionOptions("target_attention", (SINKS, WINDOW, SCALE))

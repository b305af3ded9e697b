"""One spec per DFlash op: its name, inputs, outputs and options, each written once.

An op's signature (its tensor inputs in order, its outputs, its options) used to be written by
hand in each layer. Now each op is one `OpSpec` below, and the layers derive from it:

- `ops` (the entry points): the signature and the forwarding, `OpSpec.takes` binds a call like
  Python would and hands the arguments on positionally, in spec order (kernel else reference);
- `custom_ops`: the `dflash::` op's signature (so its schema), the in-place inputs, the functional
  form's extra outputs, and the registration;
- `reference`, `reference_dflash2`: the one place an op's signature is written out, to be read
  as its definition; `tests/test_op_specs.py` checks it against the spec (inputs + options);
- `kernels.launch`, `kernels.dflash2_launch`: each launcher takes the spec's parameters through
  `OpSpec.launcher` and reads them from one named tuple (`inputs.q`, ...);
- `plugins.onnx_nodes`, `plugins.dflash2_nodes`: a node's inputs, outputs and aliases.

The options of the attention ops are `attention_options` rows (`OpSpec.options`): after the op's
own inputs, in their call order (required first). Like `attention_options`, this module imports
neither torch nor TensorRT: callers pass their tensor type in.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
from typing import Callable, Optional

from trtllm_dflash.contracts import names
from trtllm_dflash.ops.attention_options import BLOCK_ATTENTION as _BLOCK_OPTIONS
from trtllm_dflash.ops.attention_options import TARGET_ATTENTION as _TARGET_OPTIONS
from trtllm_dflash.ops.attention_options import AttentionOptions, _bind, with_signature

EMPTY = inspect.Parameter.empty


@dataclasses.dataclass(frozen=True)
class Arg:
    """An op input: a tensor, a tensor that may be None (`Tensor?`), or an int."""

    name: str
    type: str = "Tensor"  # "Tensor", "Tensor?" or "int" (torch schema types)
    default: object = EMPTY  # only trailing `Tensor?` inputs have one (None)

    def annotation(self, tensor: object):
        if self.type == "int":
            return int
        if tensor is None:
            return EMPTY
        return Optional[tensor] if self.type == "Tensor?" else tensor


def tensors(*input_names: str) -> tuple[Arg, ...]:
    return tuple(Arg(name) for name in input_names)


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One op: its inputs, outputs and options, in call order."""

    name: str  # the entry point's and the reference function's name
    inputs: tuple[Arg, ...]
    outputs: tuple[str, ...]
    options: Optional[AttentionOptions] = None
    mutates: tuple[str, ...] = ()  # inputs the `dflash::` op updates in place (the caches)
    op: str = ""  # the `dflash::` op's name, when it is not `name`

    @property
    def op_name(self) -> str:
        return self.op or self.name

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.inputs)

    @property
    def names(self) -> tuple[str, ...]:
        """Every parameter in call order: the inputs, then the options (required ones first)."""
        options = tuple(o.name for o in self.options.call_order) if self.options else ()
        return self.input_names + options

    @property
    def node_inputs(self) -> tuple[str, ...]:
        """A plugin node's inputs: the op's own, then one per tensor option."""
        return self.input_names + (self.options.input_names if self.options else ())

    def index(self, name: str) -> int:
        return self.names.index(name)

    # ------------------------------------------------------------------ derived ops

    def functional(self) -> OpSpec:
        """The exportable form of an in-place op: nothing mutated, each updated input an extra output."""
        return dataclasses.replace(self, name=f"{self.name}_functional", op="", mutates=(), outputs=self.outputs + tuple(self.aliases))

    @property
    def aliases(self) -> dict[str, str]:
        """The functional form's extra outputs -> the inputs they update (a node's in-place aliases)."""
        return {f"{name}_out": name for name in self.mutates}

    def replace(self, **changes) -> OpSpec:
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ Python signatures

    def parameters(self, tensor: object) -> list[inspect.Parameter]:
        own = [
            inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=a.annotation(tensor), default=a.default)
            for a in self.inputs
        ]
        return own + (self.options.parameters(tensor) if self.options else [])

    def returns(self, tensor: object):
        if tensor is None:
            return inspect.Signature.empty
        return tensor if len(self.outputs) == 1 else tuple[(tensor,) * len(self.outputs)]

    def takes(self, tensor: object, name: str = "", doc: str | None = None) -> Callable:
        """Decorate `fn(*args, [keyword-only parameters])` to take this op's parameters.

        The result has the full signature (what `torch.library.custom_op`, `help()` and callers see:
        the spec's parameters, then `fn`'s keyword-only ones); a call binds positional and keyword
        arguments like Python, fills the defaults, casts the scalar options to their type and
        passes every parameter to `fn` positionally, in `names` order. `name`, `doc`: the result's
        `__name__` and `__doc__` (default: `fn`'s).
        """

        def decorate(fn: Callable) -> Callable:
            keyword = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.kind == inspect.Parameter.KEYWORD_ONLY]
            params = self.parameters(tensor)
            own = inspect.Signature(params)
            signature = inspect.Signature(params + keyword, return_annotation=self.returns(tensor))
            order = list(own.parameters)
            fallback = {p.name: p.default for p in params if p.default is not EMPTY}
            casts = [(order.index(o.name), o.type) for o in (self.options.scalars if self.options else ())]
            extra = {p.name for p in keyword}
            count = len(order)

            def call(*args, **kwargs):
                # binds by hand: Signature.bind costs ~10x more, on every layer of every step
                given = {}
                if kwargs and extra:
                    given = {k: kwargs.pop(k) for k in extra & kwargs.keys()}
                if kwargs or len(args) != count:
                    args = _bind(own, order, fallback, args, kwargs)
                if casts:
                    args = list(args)
                    for i, cast in casts:
                        args[i] = cast(args[i])
                return fn(*args, **given)

            wrapped = with_signature(call, signature, like=fn)
            if name:
                wrapped.__name__ = wrapped.__qualname__ = name
            if doc is not None:
                wrapped.__doc__ = doc
            return wrapped

        return decorate

    def launcher(self, tensor: object) -> Callable:
        """Decorate a kernel launcher `fn(inputs, *, [keyword-only knobs], **options)` to take this
        op's parameters without writing them again.

        The result has the spec's signature then `fn`'s knobs (like `takes`); `fn` gets the op's
        inputs as one named tuple (`inputs.q`, `inputs.k_cache`, ...) and the options by name. The
        reference function is where an op's signature is written out, once, to be read."""
        count = len(self.inputs)
        option_names = self.names[count:]
        inputs_type = collections.namedtuple(f"{self.name}_inputs", self.input_names)

        def decorate(fn: Callable) -> Callable:
            def call(*args, **knobs):
                return fn(inputs_type._make(args[:count]), **knobs, **dict(zip(option_names, args[count:])))

            own = inspect.signature(fn, eval_str=True).parameters.values()
            call.__signature__ = inspect.Signature([p for p in own if p.kind == inspect.Parameter.KEYWORD_ONLY])
            call.__module__, call.__qualname__ = fn.__module__, fn.__qualname__
            return self.takes(tensor, name=fn.__name__, doc=fn.__doc__)(call)

        return decorate


# ----------------------------------------------------------------------------- the ops

_SAMPLING = (Arg(names.DRAFT_PROBS, "Tensor?"), *tensors(*names.SAMPLING_INPUTS, "start"))  # verification's, after logits and tokens

BLOCK_ATTENTION = OpSpec(
    "block_attention",
    tensors("q", "k_block", "v_block", "k_ctx_new", "v_ctx_new", names.NEW_COUNTS, "k_cache", "v_cache", names.CACHE_LENS),
    ("out",),
    _BLOCK_OPTIONS,
    mutates=("k_cache", "v_cache"),
)
TARGET_ATTENTION = OpSpec(
    "target_attention",
    tensors("q", "k_new", "v_new", "k_cache", "v_cache", names.STARTS),
    ("out",),
    _TARGET_OPTIONS,
    mutates=("k_cache", "v_cache"),
)
VERIFY_BLOCK = OpSpec("verify_block", (*tensors("target_logits", "block_tokens"), *_SAMPLING), ("accepted", "bonus"))
# the `dflash::verify_block` op returns the packed result (`reference.VERIFY_RESULT_COLUMNS`)
VERIFY_BLOCK_PACKED = VERIFY_BLOCK.replace(
    name="verify_block_packed", op="verify_block", inputs=VERIFY_BLOCK.inputs + (Arg("stop_ids", "Tensor?", None),), outputs=(names.RESULT,)
)
# its two stages (kernels and plugin nodes): per-position decisions, then the commit
VERIFY_POSITIONS = VERIFY_BLOCK.replace(name="verify_positions", outputs=("decisions",))
VERIFY_COMMIT = OpSpec("verify_commit", (*tensors("decisions", "block_tokens", "start"), Arg("stop_ids", "Tensor?", None)), (names.RESULT,))

GROUPED_DYNAMIC_CONV = OpSpec("grouped_dynamic_conv", (*tensors("x", "delta", "base"), Arg("residual", "Tensor?", None)), ("out",))
# the selector's walk over the top-k candidates (a kernel and a plugin node of its own)
CANDIDATE_WALK = OpSpec(
    "candidate_walk",
    tensors("cand", "cand_unary", "z", "anchor", "predecessor", "successor", "temperature", "seed", "positions"),
    ("tokens", "cand_probs"),
)
CANDIDATE_SELECT = OpSpec(
    "candidate_select",
    (Arg("unary"), *CANDIDATE_WALK.inputs[2:], Arg("top_k", "int")),
    ("tokens", "cand", "cand_probs"),
)

SPECS = (
    BLOCK_ATTENTION,
    TARGET_ATTENTION,
    VERIFY_BLOCK,
    VERIFY_BLOCK_PACKED,
    VERIFY_POSITIONS,
    VERIFY_COMMIT,
    GROUPED_DYNAMIC_CONV,
    CANDIDATE_WALK,
    CANDIDATE_SELECT,
)

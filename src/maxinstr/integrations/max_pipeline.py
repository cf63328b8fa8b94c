"""MAX's own pipelines as the ``max`` preset sees them: where to wrap, what a wrapped call means. Nothing
imports MAX: its objects arrive as arguments, read by attribute; a surprise gives a plain answer, not an
error (these run inside MAX's calls)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_RELEASE = "26.7"  # the release the wrap points were read from (tests/examples/test_max_wrap_points.py)

_TG = "max.pipelines.lib.pipeline_variants.text_generation"
_OVERLAP = "max.pipelines.lib.pipeline_variants.overlap_text_generation"
_TOKENIZER = "max.pipelines.lib.tokenizer"
_SAMPLER = "max.pipelines.sampling.sampling_logits_processor"
_ENGINE = "max.engine.api"


@dataclass(frozen=True)
class WrapPoint:  # one ``--stage`` spec of the preset and what it stands for
    spec: str  # MODULE:QUALNAME=name, or =@hook for a wrap with logic (launch/instrument.py)
    what: str  # one line for the docs and the plan


WRAP_POINTS: tuple[WrapPoint, ...] = (
    WrapPoint(f"{_TG}:TextGenerationPipeline.execute=@max-step",
              "one pipeline step: stage prefill when a context in the batch has processed nothing yet, else decode"),
    WrapPoint(f"{_OVERLAP}:OverlapTextGenerationPipeline.execute=@max-step",
              "the same for the overlap scheduler's pipeline (the GPU default of max serve); an empty batch is drain"),
    WrapPoint(f"{_TG}:TextGenerationPipeline.__init__=@max-model",
              "finds the architecture's model class (pipeline._pipeline_model) and wraps its execute as forward"),
    WrapPoint(f"{_OVERLAP}:OverlapTextGenerationPipeline.__init__=@max-model", "the same for the overlap pipeline"),
    WrapPoint(f"{_SAMPLER}:FusedSamplingProcessor.__call__=sample", "the sampler: MAX's sampling graph over the step's logits"),
    WrapPoint(f"{_TOKENIZER}:run_with_default_executor=@max-tokenize",
              "the tokenizer's work in its thread pool (encode, the chat template) as tokenize, on the pool's thread "
              "(in max serve: the API server process)"),
    WrapPoint(f"{_TOKENIZER}:TextTokenizer.decode=detokenize", "tokens back to text (max generate: once a step)"),
    WrapPoint(f"{_TOKENIZER}:TextTokenizer.new_context=@max-arrival",
              "a mark queued (attr request) when a request's context is made: where its queueing starts"),
    WrapPoint(f"{_TOKENIZER}:TextAndVisionTokenizer.decode=detokenize", "the same for multimodal models' tokenizer"),
    WrapPoint(f"{_TOKENIZER}:TextAndVisionTokenizer.new_context=@max-arrival", "the same for multimodal models' tokenizer"),
    WrapPoint(f"{_ENGINE}:Model.execute=graph", "one execution of a compiled MAX graph (the model's, the sampler's, ...)"),
    WrapPoint(f"{_ENGINE}:Model.replay=graph", "one replay of a captured device graph (graph capture on the GPU)"),
    WrapPoint(f"{_ENGINE}:InferenceSession.load_all=load", "compile and weight binding of a graph (load() calls it)"),
    WrapPoint(f"{_ENGINE}:InferenceSession.compile=compile", "the compile alone (a warm compile cache makes it short)"),
    WrapPoint(f"{_ENGINE}:InferenceSession.init_all=init", "binding the weights to a compiled graph"),
)

QUEUED_MARK = "queued"


def step_stage(inputs: Any) -> tuple[str, dict[str, int | str]]:
    """The stage (``prefill``, ``decode`` or ``drain``, attrs) of one pipeline step over ``inputs``
    (``TextGenerationInputs``): ``batch``, ``tokens``, ``new``, on a prefill ``requests`` (docs/max.md)."""
    try:
        flat = getattr(inputs, "flat_batch", None)
        batch, tokens = list(flat if flat is not None else [c for b in getattr(inputs, "batches", ()) for c in b]), 0
        new: list[str] = []
        for ctx in batch:
            t = getattr(ctx, "tokens", None)
            tokens += int(getattr(t, "active_length", 0) or 0)
            if int(getattr(t, "processed_length", 1) or 0) == 0:
                new.append(request_key(ctx))
    except Exception:  # noqa: BLE001 - runs inside MAX's step: an input we cannot read is still a step
        return "step", {}
    if not batch:
        return "drain", {"batch": 0}
    attrs: dict[str, int | str] = {"batch": len(batch), "tokens": tokens, "new": len(new)}
    if new:
        attrs["requests"] = ",".join(new)
        return "prefill", attrs
    return "decode", attrs


def request_key(context: Any) -> str:  # a context's ``request_id`` as text (MAX's RequestID: its value)
    rid = getattr(context, "request_id", None)
    return str(getattr(rid, "value", rid))


def model_execute_spec(pipeline: Any, name: str = "forward") -> tuple[str | None, str | None]:
    """``(spec, None)``: the ``--stage`` spec wrapping ``execute`` of ``pipeline._pipeline_model``'s class
    (``Llama3Model``), or ``(None, why)``."""
    if (model := getattr(pipeline, "_pipeline_model", None)) is None:
        return None, f"{type(pipeline).__qualname__} has no _pipeline_model (MAX {MAX_RELEASE} had one)"
    cls = type(model)
    if not callable(getattr(cls, "execute", None)):
        return None, f"{cls.__module__}.{cls.__qualname__} has no execute"
    if "<" in cls.__qualname__:  # a class made inside a function cannot be named by a spec
        return None, f"{cls.__module__}.{cls.__qualname__} is a local class"
    return f"{cls.__module__}:{cls.__qualname__}.execute={name}", None


MAX_ENTRY_MODULES = ("max.entrypoints", "max._entrypoints")


def is_max_command(command: Sequence[str]) -> bool:
    """Whether ``command`` runs MAX's own entry point: the ``max`` program or ``python -m max.entrypoints...``."""
    if not command:
        return False
    if Path(command[0]).name == "max":
        return True
    args = list(command[1:])
    for i, arg in enumerate(args):
        module = args[i + 1] if arg == "-m" and i + 1 < len(args) else arg[2:] if arg.startswith("-m") and len(arg) > 2 else None
        if module is not None:
            return any(module == m or module.startswith(m + ".") for m in MAX_ENTRY_MODULES)
        if not arg.startswith("-"):
            return False  # a script: its own code, whatever it imports
    return False


TELEMETRY_VARIABLE = "MAX_SERVE_DISABLE_TELEMETRY"  # on: no telemetry process or exporter threads, nothing sent


def compile_cache_dirs(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Where MAX keeps what it compiled: ``$MODULAR_DERIVED_PATH/cache``, else ``~/.cache/modular`` (26.7)."""
    env = os.environ if environ is None else environ
    derived = env.get("MODULAR_DERIVED_PATH")
    root = os.path.join(derived, "cache") if derived else os.path.join(os.path.expanduser("~"), ".cache", "modular")
    return {sub: os.path.join(root, f".{sub}_cache") for sub in ("max", "mogg", "mojo")}


def cache_entries(dirs: Mapping[str, str]) -> dict[str, int]:  # files each holds (a run adding some compiled cold)
    return {key: sum(len(files) for _root, _dirs, files in os.walk(path)) for key, path in dirs.items()}

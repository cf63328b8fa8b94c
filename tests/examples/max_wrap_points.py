"""The max preset's wrap points checked against the installed MAX, in a process of its own:
importing MAX loads Mojo's runtime, which sets PYTHONEXECUTABLE in the process's environment (to
the `python3` on PATH), and every later child of that process would start without its venv. So
tests/examples/test_max_pipelines.py runs each check here, `python max_wrap_points.py CHECK`:
exit status 0, or an AssertionError naming the wrap point and what moved."""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from importlib.metadata import version

import numpy as np

from maxinstr.integrations import max_pipeline
from maxinstr.launch.instrument import parse_spec


def _resolve(spec_text: str):
    """(owner, the target's value, a line naming the wrap point) in the installed MAX."""
    spec = parse_spec(spec_text)
    where = f"wrap point {spec_text} (read from MAX {max_pipeline.MAX_RELEASE}; installed MAX {version('max')})"
    try:
        owner = importlib.import_module(spec.module)
    except ImportError as exc:
        raise AssertionError(f"{where}: module {spec.module} is gone: {exc}") from None
    parts = spec.qualname.split(".")
    for part in parts[:-1]:
        assert hasattr(owner, part), f"{where}: {spec.module} has no {part}"
        owner = getattr(owner, part)
    value = inspect.getattr_static(owner, parts[-1], None) if inspect.isclass(owner) else getattr(owner, parts[-1], None)
    assert value is not None and callable(value), f"{where}: {spec.module}:{spec.qualname} is gone"
    return owner, value, where


def wrap_points() -> None:
    for point in max_pipeline.WRAP_POINTS:
        _owner, func, where = _resolve(point.spec)
        hook = parse_spec(point.spec).name
        if hook == "@max-step":  # execute(self, inputs): the hook reads the batch from `inputs`
            params = list(inspect.signature(func).parameters)
            assert params[:2] == ["self", "inputs"], f"{where}: execute takes {params}, not (self, inputs)"
        elif hook == "@max-model":  # the pipeline keeps the architecture's model in _pipeline_model
            assert re.search(r"self\._pipeline_model\b[^=\n]*=", inspect.getsource(func)), \
                f"{where}: __init__ no longer sets self._pipeline_model"
        elif hook == "@max-tokenize":
            assert inspect.iscoroutinefunction(func), f"{where}: no longer a coroutine function"
            assert list(inspect.signature(func).parameters)[0] == "fn", f"{where}: no longer takes fn first"
        elif hook == "@max-arrival":
            assert inspect.iscoroutinefunction(func), f"{where}: new_context is no longer a coroutine function"


def architectures() -> None:
    from max.pipelines import PIPELINE_REGISTRY
    from max.pipelines.modeling.types import PipelineTask

    archs = [a for a in PIPELINE_REGISTRY.all_architectures() if a.task == PipelineTask.TEXT_GENERATION]
    assert len(archs) > 20, len(archs)  # MAX 26.7 registers dozens of text-generation architectures
    missing = [a.name for a in archs if not callable(getattr(a.pipeline_model, "execute", None))]
    assert not missing, f"text-generation architectures whose model class has no execute (no forward stage): {missing}"
    llama = PIPELINE_REGISTRY.retrieve_architecture("LlamaForCausalLM").pipeline_model

    class Pipeline:  # what the hook reads of a pipeline: its _pipeline_model
        def __init__(self, model):
            self._pipeline_model = model

    spec, problem = max_pipeline.model_execute_spec(Pipeline(llama.__new__(llama)))
    assert problem is None and spec == f"{llama.__module__}:{llama.__qualname__}.execute=forward", (spec, problem)
    _resolve(spec)


def steps() -> None:
    from max.pipelines.context import TextContext, TokenBuffer
    from max.pipelines.modeling.types import RequestID, TextGenerationInputs

    contexts = [TextContext(request_id=RequestID(), max_length=64, tokens=TokenBuffer(np.arange(n, dtype=np.int64)))
                for n in (8, 5)]
    name, attrs = max_pipeline.step_stage(TextGenerationInputs(batches=[contexts]))
    ids = [max_pipeline.request_key(c) for c in contexts]
    assert name == "prefill" and attrs == {"batch": 2, "tokens": 13, "new": 2, "requests": ",".join(ids)}, attrs
    assert all(len(i) > 8 and i != "None" for i in ids), ids  # the id's own text, not an object's repr
    for ctx in contexts:  # as MAX does after the step: the prompt is processed, one new token
        ctx.update(7)
    name, attrs = max_pipeline.step_stage(TextGenerationInputs(batches=[contexts]))
    assert name == "decode" and attrs == {"batch": 2, "tokens": 2, "new": 0}, (name, attrs)
    assert max_pipeline.step_stage(TextGenerationInputs(batches=[[]]))[0] == "drain"


if __name__ == "__main__":
    {"wrap_points": wrap_points, "architectures": architectures, "steps": steps}[sys.argv[1]]()
    print("ok")

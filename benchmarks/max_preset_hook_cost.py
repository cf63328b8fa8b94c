"""What one call through a max-preset wrap point costs on the host: a method wrapped by the
`@max-step` hook (a batch of 4 contexts read for the prefill/decode split and its attrs) and by a
plain `--stage` spec, against the bare method; in a session, best of 5 blocks of 20000 calls.

    python benchmarks/max_preset_hook_cost.py
"""

from __future__ import annotations

import sys
import tempfile
import types

from harness import block_ns, load_average, print_table

import maxinstr
from maxinstr.launch.instrument import instrument

CALLS, BLOCKS = 20000, 5


class Tokens:  # what the hook reads of a MAX context's tokens
    def __init__(self) -> None:
        self.active_length, self.processed_length = 1, 10


class Context:
    def __init__(self, i: int) -> None:
        self.tokens, self.request_id = Tokens(), f"r{i}"


class Inputs:  # MAX's TextGenerationInputs: the batch's contexts
    def __init__(self, n: int) -> None:
        self.flat_batch = [Context(i) for i in range(n)]


class Pipeline:
    def execute(self, inputs: Inputs) -> None:
        return None

    def plain(self, inputs: Inputs) -> None:
        return None


def main() -> int:
    module = types.ModuleType("hookcost_pipeline")
    module.Pipeline = Pipeline  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    bare = Pipeline.execute
    rows = []
    with maxinstr.session(tempfile.mkdtemp(prefix="hookcost-") + "/run"):
        instrument(f"{module.__name__}:Pipeline.execute=@max-step")
        instrument(f"{module.__name__}:Pipeline.plain=plain")
        pipe, inputs = Pipeline(), Inputs(4)
        cases = {"bare method": lambda: bare(pipe, inputs), "plain --stage wrap": lambda: pipe.plain(inputs),
                 "@max-step hook, batch of 4": lambda: pipe.execute(inputs)}
        for name, call in cases.items():
            def loop(n: int, call=call) -> None:
                for _ in range(n):
                    call()

            best = min(block_ns(loop, CALLS) for _ in range(BLOCKS))
            rows.append([name, best])
    print(f"{load_average()}; best of {BLOCKS} blocks of {CALLS} calls")
    print_table(["case", "ns per call"], rows, [None, ".0f"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

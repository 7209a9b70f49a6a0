"""Cutting a generate call's tail (``SamplingParams.finish_after_fraction``) on a vLLM engine.

``LLM.generate`` runs every request to its end, so a call takes as long as its slowest
sample. ``generate_cut`` drives the engine itself instead (what ``LLM.generate`` does inside,
vllm/entrypoints/common/offline.py ``_render_and_add_requests`` and ``_run_engine``): it adds
one request per prompt, steps the engine, and once ``target`` prompts have all their n
samples finished it aborts every request still running. How this meets vLLM 0.32:

* Partial outputs: the requests use ``RequestOutputKind.CUMULATIVE`` (``LLM.generate``
  forces ``FINAL_ONLY``), so every step returns each scheduled sample's tokens and logprobs
  so far; the last one seen is what an aborted sample returns. An abort through
  ``LLMEngine.abort_request`` produces no final output for us (the output processor only
  queues one for requests with an output queue, the async client's), and the tokens the core
  may still generate after it (an engine core in another process runs ahead) are dropped by
  the output processor. Tokens and logprobs are updated together in one step's output
  processing, so a partial sample always has one logprob per token.
* n > 1: vLLM V1 fans a request out into n child requests ``"{j}_{internal id}"``
  (vllm/v1/engine/parallel_sampling.py); with a streaming output kind each step's
  ``RequestOutput`` holds only the child that moved (``CompletionOutput.index`` = j).
  ``add_request`` returns the parent's internal id; ``abort_request(ids, internal=True)``
  with it aborts the children still running and drops the parent's record
  (vllm/v1/engine/output_processor.py ``abort_requests``). Aborting by the external id would
  reach the children too but leave the ``ParentRequest`` behind in ``parent_requests``.
* Seeds: each request keeps the seed the uncut call would give it (``_request_seed``; child j
  draws from ``seed + j``), and the requests are added in the same order, so until the cut
  the engine schedules and samples exactly as ``LLM.generate`` would.
* Afterwards the engine holds no request (``has_unfinished_requests()`` is False) and, with
  the core in this process, the scheduler has returned every KV block (vLLM frees an aborted
  request's blocks in ``Scheduler.finish_requests``); tests/vllm_backend/test_abort.py checks
  both.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

_CALLS = itertools.count()
"""Numbers the cut calls of this process, so that no request id is ever reused (vLLM adds
a random suffix internally; ours keeps ``prompt_of`` unambiguous and vLLM's logs readable)."""


def generate_cut(
    llm: Any,
    prompts: Sequence[dict[str, Any]],
    params: Sequence[Any],
    n: int,
    target: int,
) -> list[list[tuple[Any | None, bool]]]:
    """Generate ``prompts`` with vLLM ``params`` until ``target`` prompts have all their ``n``
    samples finished, then abort the rest.

    Returns, per prompt and sample index, ``(completion, aborted)``: the last
    ``CompletionOutput`` seen for that sample (None when it never produced a token) and
    whether it was still running at the cut.
    """
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    if engine.has_unfinished_requests():
        # Its outputs would be ours to drop or to misread: every call drains the engine.
        raise RuntimeError("the vLLM engine has unfinished requests before a generate call")
    call = next(_CALLS)
    external = [f"cut{call}-{i}" for i in range(len(prompts))]
    prompt_of = {request_id: i for i, request_id in enumerate(external)}
    latest: list[list[Any | None]] = [[None] * n for _ in prompts]
    finished = [0] * len(prompts)  # samples of each prompt with a final output
    internal: list[str] = []
    done = 0
    try:
        for request_id, prompt, request_params in zip(external, prompts, params, strict=True):
            request_params.output_kind = RequestOutputKind.CUMULATIVE
            # Rendered as LLM.generate renders it, so the engine sees the same input.
            engine_input = llm._preprocess_cmpl_one(prompt)
            internal.append(engine.add_request(request_id, engine_input, request_params))
        while done < target and engine.has_unfinished_requests():
            for output in engine.step():
                i = prompt_of[output.request_id]
                for completion in output.outputs:
                    before = latest[i][completion.index]
                    latest[i][completion.index] = completion
                    if completion.finished() and (before is None or not before.finished()):
                        finished[i] += 1
                        if finished[i] == n:
                            done += 1
    finally:
        # The cut, or an error half-way: leave the engine empty either way. Requests that
        # finished are gone from the output processor already; aborting them is a no-op.
        if engine.has_unfinished_requests():
            engine.abort_request(internal, internal=True)
    return [[(c, c is None or not c.finished()) for c in samples] for samples in latest]

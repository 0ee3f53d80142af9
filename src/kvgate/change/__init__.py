"""Stage 2 of kvgate's flow, the change under test: which vLLM runs, how it is built, what it touches.

Owns
    spec              `--vllm SPEC` / `--base-vllm SPEC`: release, patch:, source:, wheel: (parsed, checked)
    patch             unified diffs against vLLM's sources: read, sort their paths, apply exactly (pure)
    overlay           the vLLM a run tests, built beside the engine environment (a hard-linked overlay of the
                      release with the changed files real, or a wheel unpacked), and its run.json record
    sides             the sides of a run: head (the vLLM under test) and, in an A/B run, base
    declared_support  the matrix's declared backend support (and host requirements) against a vLLM's own code

It may import the matrix and the results (the side names); it must never import the runners, the kernels,
the gate, the report, the workloads or the CLI. vLLM and torch are imported only inside the functions that read
an installed vLLM (declared_support). tests/test_layout.py enforces it.
"""

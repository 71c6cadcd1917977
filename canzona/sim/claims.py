"""The Canzona paper's headline (arXiv 2602.06079; docs/design.md §1), printed beside projections.

A module of its own (no torch, no planner) so that the report can label projections cheaply.
"""

PAPER_CLAIMS = {
    # which run the ratios are against, the readable part of the paper does not say
    "setting": "Qwen3 up to 32B on 256 GPUs, Canzona against the paper's baseline",
    "iteration_speedup": 1.57,
    "optimizer_step_speedup": 5.8,
}

"""Synthetic, seeded, DP-consistent token batches (no torch.distributed, no megatron).

Global row ``i`` of step ``s`` depends only on ``(seed, s, i)`` (its own generator), so the
global batch of a step is the same for every DP size: DP rank ``r`` of ``dp`` with micro-batch
``b`` takes global rows ``[r*b, (r+1)*b)``. Hence dp=2 with micro-batch b sees exactly the rows
of dp=1 with micro-batch 2b. Each rank's loss is the mean over its own ``b * seq_len`` tokens;
all ranks have the same token count, so the global loss is the mean of the per-rank losses
over DP ranks (all-reduce SUM / dp), and equals the dp=1 loss on 2b rows; gradients compare the
same way (DDP averages them over DP).

Sequences are learnable, so training curves go down: a fixed random successor permutation
(from ``seed`` only) gives the next token, except that with probability ``noise`` a position
restarts at a uniformly random token. The best achievable loss is about
``noise * ln(vocab)`` (plus a little), starting from ``ln(vocab)``.
"""

from __future__ import annotations

import hashlib

import torch

from canzona.errors import ConfigError
from canzona.inventory import ModelConfig


def _seed(*parts: object) -> int:
    digest = hashlib.sha256("/".join(map(str, ("canzona-data", *parts))).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _successor(vocab: int, seed: int) -> torch.Tensor:
    return torch.randperm(vocab, generator=torch.Generator().manual_seed(_seed(seed, "perm")))


def synthetic_batch(
    mcfg: ModelConfig,
    micro_batch: int,
    seq_len: int,
    seed: int,
    step: int,
    dp_rank: int = 0,
    dp: int = 1,
    *,
    noise: float = 0.25,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokens, labels``: int64 CPU tensors ``[micro_batch, seq_len]`` for this DP rank;
    ``labels[:, t] == tokens[:, t+1]`` (next-token prediction over seq_len+1 generated tokens)."""
    for what, v in (("micro_batch", micro_batch), ("seq_len", seq_len), ("dp", dp)):
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"{what}={v!r} must be a positive integer")
    if not (isinstance(dp_rank, int) and 0 <= dp_rank < dp):
        raise ConfigError(f"dp_rank={dp_rank!r} must be an integer in [0, {dp})")
    if not 0.0 <= noise <= 1.0:
        raise ConfigError(f"noise={noise!r} must be in [0, 1]")
    n = seq_len + 1
    rand_tok = torch.empty(micro_batch, n, dtype=torch.int64)
    restart = torch.empty(micro_batch, n, dtype=torch.bool)
    for j in range(micro_batch):
        g = torch.Generator().manual_seed(_seed(seed, step, dp_rank * micro_batch + j))
        rand_tok[j] = torch.randint(0, mcfg.vocab, (n,), generator=g)
        restart[j] = torch.rand(n, generator=g) < noise
    restart[:, 0] = True
    succ = _successor(mcfg.vocab, seed)
    seq = torch.empty_like(rand_tok)
    seq[:, 0] = rand_tok[:, 0]
    for t in range(1, n):
        seq[:, t] = torch.where(restart[:, t], rand_tok[:, t], succ[seq[:, t - 1]])
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

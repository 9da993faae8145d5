"""The PyTorch baseline: torch.nn.Transformer in eager mode, set up as our model.

It runs where our side runs: on CUDA when JAX's default backend is a GPU (and
PyTorch sees one), else on the CPU with one thread per core (DEVICE).

Same as ours: post-LN, relu, shared embedding scaled by sqrt(d_model),
sinusoidal positions, tied pre-softmax projection, dropout P_drop on sub-layer
outputs and embedding sums only (nn.Transformer's attention-probability and
FFN-inner dropouts are switched off, as in the paper and our model), no final
encoder/decoder LayerNorm (nn.Transformer adds one by default; post-LN has
none), label-smoothed cross-entropy over non-PAD targets, Adam(0.9, 0.98, 1e-9)
on the section 5.3 schedule. Greedy decoding has no KV cache (nn.Transformer
has none): every step re-runs the decoder over the whole prefix.
"""

import math
import os
import time
import warnings

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

from benchmarks import common
from transformer.data.tokenizer import BOS_ID, PAD_ID
from transformer import runtime
from transformer.model import sinusoidal_table
from benchmarks.jax_bench import page_faults

# Where JAX computes, judged without starting its client: a started one takes 75%
# of the GPU's memory, which PyTorch's own process (benchmarks.alone) then lacks.
DEVICE = "cuda" if runtime.accelerator_expected() and torch.cuda.is_available() else "cpu"
# float32 products on a GPU: JAX's default precision runs them as TF32; PyTorch's
# is strict float32, about 7x slower on an H200. Both sides get TF32, each
# framework's fast float32 (what a user of either would turn on).
if DEVICE == "cuda":
  torch.set_float32_matmul_precision("high")
  torch.backends.cudnn.allow_tf32 = True
FLOAT32_MATMUL = "tf32" if DEVICE == "cuda" else "float32"

# The encoder's inference fast path (nested tensors for padding) warns it is a prototype.
warnings.filterwarnings("ignore", message=".*nested tensors is in prototype.*")


class TorchTransformer(nn.Module):

  def __init__(self, size, max_len=256):
    super().__init__()
    D = size.d_model
    self.scale = math.sqrt(D)
    self.embed = nn.Embedding(size.vocab_size, D)
    nn.init.normal_(self.embed.weight, std=D**-0.5)
    self.register_buffer("pe", torch.from_numpy(sinusoidal_table(max_len, D)))
    self.drop = nn.Dropout(size.dropout)
    kw = dict(d_model=D, nhead=size.num_heads, dim_feedforward=size.d_ff,
              dropout=size.dropout, activation="relu", batch_first=True, norm_first=False)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(**kw), size.num_layers)
    decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(**kw), size.num_layers)
    for layer in list(encoder.layers) + list(decoder.layers):
      layer.dropout = nn.Identity()  # FFN-inner dropout: not in the paper.
      for attention in ("self_attn", "multihead_attn"):
        if hasattr(layer, attention):
          getattr(layer, attention).dropout = 0.0  # Attention-probability dropout.
    self.core = nn.Transformer(d_model=D, nhead=size.num_heads, batch_first=True,
                               custom_encoder=encoder, custom_decoder=decoder)

  def embed_ids(self, ids_BxT):
    return self.drop(self.embed(ids_BxT) * self.scale + self.pe[:ids_BxT.shape[1]])

  def forward(self, src_BxS, tgt_in_BxT):
    pad_BxS = src_BxS == PAD_ID
    causal_TxT = nn.Transformer.generate_square_subsequent_mask(tgt_in_BxT.shape[1])
    y_BxTxD = self.core(self.embed_ids(src_BxS), self.embed_ids(tgt_in_BxT),
                        tgt_mask=causal_TxT, tgt_is_causal=True,
                        src_key_padding_mask=pad_BxS, memory_key_padding_mask=pad_BxS)
    return y_BxTxD @ self.embed.weight.T


def _schedule(d_model, warmup=4000):
  return lambda count: d_model**-0.5 * min((count + 1)**-0.5, (count + 1) * warmup**-1.5)


def sync():
  """Waits for the device's queued work (CUDA runs asynchronously; the CPU does not)."""
  if DEVICE == "cuda":
    torch.cuda.synchronize()


def matmul_peak(n=2048, repeats=5, dtype="float32"):
  """FLOP/s of the best of `repeats` [n, n] x [n, n] torch.mm products in `dtype`."""
  a, b = (torch.randn(n, n, device=DEVICE).to(getattr(torch, dtype)) for _ in range(2))
  torch.mm(a, b)
  sync()
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    torch.mm(a, b)
    sync()
    best = min(best, time.perf_counter() - t0)
  return 2 * n**3 / best


def tensor(ids):
  """int64 ids on DEVICE."""
  return torch.from_numpy(np.asarray(ids).astype(np.int64)).to(DEVICE)


def _tensors(batch):
  targets = tensor(batch["targets"])  # Teacher forcing: BOS, then the targets one step late.
  return tensor(batch["inputs"]), F.pad(targets, (1, 0), value=BOS_ID)[:, :-1], targets


def _autocast(dtype):
  """Computation in `dtype` (a name: float32 = as is) under torch.autocast on DEVICE."""
  return torch.autocast(DEVICE, dtype=getattr(torch, dtype), enabled=dtype != "float32")


class Trainer:
  """PyTorch's step over the same batches: warm_up() runs one per shape, step(i) times one."""

  def __init__(self, size, batches, seed=0):
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(seed)
    self.size, self.batches = size, batches
    self.model = TorchTransformer(size).to(DEVICE)
    self.opt = torch.optim.Adam(self.model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, _schedule(size.d_model))
    self._data = [_tensors(b) for b in batches]
    self.times, self.cpu, self.losses, self.faults = [], [], [], 0

  def _run(self, i):
    src, tgt_in, tgt = self._data[i]
    self.model.train()
    self.opt.zero_grad(set_to_none=True)
    with _autocast(self.size.dtype):
      logits = self.model(src, tgt_in)
      loss = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=PAD_ID,
                             label_smoothing=0.1, reduction="sum")
    loss = loss / (tgt != PAD_ID).sum().clamp(min=1)
    loss.backward()
    self.opt.step()
    self.sched.step()
    return float(loss.detach())  # Waits for the step on CUDA too.

  def warm_up(self):
    """One step per distinct batch shape, as ours compiles each: on CUDA a shape's
    first step also picks its kernels (benchmarks/README.md, 'Session 22')."""
    shapes = set()
    for i, (src, tgt_in, _) in enumerate(self._data):
      if (src.shape, tgt_in.shape) not in shapes:
        shapes.add((src.shape, tgt_in.shape))
        self._run(i)

  def untimed_step(self, i):
    self._run(i)

  def step(self, i):
    f0, c0, t0 = page_faults(), time.process_time(), time.perf_counter()
    self.losses.append(self._run(i))
    self.times.append(time.perf_counter() - t0)
    self.cpu.append(time.process_time() - c0)
    self.faults += page_faults() - f0

  def figures(self):
    return common.summarize(self.size, self.batches, self.times, self.cpu, self.losses,
                            self.faults)


def step_seconds(size, batch, rows):
  """Seconds one training step on `batch` would take here, from a step on its first
  `rows` rows (after a warm-up step on them), scaled by the row count. A fresh
  model and optimizer: the benchmark's own trainer is untouched."""
  rows = min(rows, len(batch["targets"]))
  trainer = Trainer(size, [{k: v[:rows] for k, v in batch.items()}])
  trainer.warm_up()
  t0 = time.perf_counter()
  trainer._run(0)  # pylint: disable=protected-access
  return (time.perf_counter() - t0) * len(batch["targets"]) / rows


@torch.inference_mode()
def greedy(model, src_BxS, max_len_B):
  """Greedy search without a cache: step t re-runs the decoder on all t + 1 tokens.

  Rows past their limit keep flowing through (fixed shapes, like ours) and emit PAD.
  """
  pad_BxS = src_BxS == PAD_ID
  memory_BxSxD = model.core.encoder(model.embed_ids(src_BxS), src_key_padding_mask=pad_BxS)
  ys_BxT = torch.full((src_BxS.shape[0], 1), BOS_ID, dtype=torch.int64, device=DEVICE)
  for t in range(int(max_len_B.max())):
    T = ys_BxT.shape[1]
    y_BxTxD = model.core.decoder(
        model.embed_ids(ys_BxT), memory_BxSxD,
        tgt_mask=nn.Transformer.generate_square_subsequent_mask(T, device=DEVICE),
        tgt_is_causal=True,
        memory_key_padding_mask=pad_BxS)
    tok_B = (y_BxTxD[:, -1] @ model.embed.weight.T).argmax(-1)
    tok_B = torch.where(max_len_B > t, tok_B, PAD_ID)
    ys_BxT = torch.cat([ys_BxT, tok_B[:, None]], dim=1)
  return ys_BxT[:, 1:]


def decoder(model, sources_BxS, max_len_B, dtype="float32"):
  """run() greedy-decodes the batch once (autocast to `dtype`) and returns its seconds.
  One untimed run first, as ours compiles and Marian's Decoder warms up: on CUDA the
  first run also sets up its kernels (benchmarks/README.md, 'Session 22')."""
  model.eval().to(DEVICE)
  src, limits = tensor(sources_BxS), tensor(max_len_B)

  def run():
    # nn.Transformer's inference fast path rejects autocast's bfloat16 inputs.
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(fastpath and dtype == "float32")
    try:
      t0 = time.perf_counter()
      with _autocast(dtype):
        greedy(model, src, limits)
      sync()
      return time.perf_counter() - t0
    finally:
      torch.backends.mha.set_fastpath_enabled(fastpath)

  run()
  return run

"""Table 3 of the paper (variations on the base model, and the big model), scaled
to the base config.

  python -m transformer.sweep --sweep configs/sweeps/table3.py --list
  python -m transformer.sweep --sweep configs/sweeps/table3.py --workdir runs/table3 \
      --set train.num_steps=300
  python -m transformer.sweep --sweep configs/sweeps/table3.py --workdir runs/table3 --collect
Another base: --base configs/default.py (SCAN) or configs/base.py (WMT, the paper's).

The paper's rows change its base (N=6, d_model=512, d_ff=2048, h=8, d_k=64,
P_drop=0.1, eps_ls=0.1) by factors; here the same factors apply to the base
given, so on configs/base.py the rows are the paper's. A variant is named after
its paper row and the value it runs with ("A-h1", "C-N2", "D-drop0"), so the
results read against the paper's table row by row. A value that equals the
base's is left out (it is the base row).
"""

from transformer.sweep import each

BASE = "configs/multi30k.py"


def _scaled(value, factors, minimum=1):
  """value * factor, rounded, for each factor; no repeats, not the value itself."""
  out = []
  for factor in factors:
    scaled = max(minimum, round(value * factor))
    if scaled != value and scaled not in out:
      out.append(scaled)
  return out


def _rates(value, factors):
  return [r for r in dict.fromkeys(round(value * f, 4) for f in factors) if r != value]


def get_sweep(base):
  model, train = base.model, base.train
  return [
      # (A) Heads at constant compute: d_k = d_v = d_model / h (3.2.2). The paper's
      # h = 1, 4, 16, 32 at h = 8; an h that does not divide d_model is reported invalid.
      *each("A-h{}", "model.num_heads", _scaled(model.num_heads, [1 / model.num_heads,
                                                                  1 / 2, 2, 4])),
      # (B) Smaller attention key size d_k with h, d_model and d_v fixed: the paper's
      # 16 and 32 at 64 (model.d_k; queries and keys shrink, values keep d_model / h).
      *each("B-dk{}", "model.d_k", _scaled(model.d_model // model.num_heads, [1 / 4, 1 / 2])),
      # (C) Model size: N = 2, 4, 8 at 6 (in each of encoder and decoder); d_model =
      # 256, 1024 at 512 with h fixed (so d_k follows, as in the paper); d_ff = 1024,
      # 4096 at 2048.
      *each("C-N{}", "model.num_layers", _scaled(model.num_layers, [2 / 6, 4 / 6, 8 / 6])),
      *each("C-dmodel{}", "model.d_model", _scaled(model.d_model, [1 / 2, 2])),
      *each("C-dff{}", "model.d_ff", _scaled(model.d_ff, [1 / 2, 2])),
      # (D) Regularization: P_drop = 0.0, 0.2 and eps_ls = 0.0, 0.2 at 0.1 (5.4).
      *each("D-drop{:g}", "model.dropout", _rates(model.dropout, [0, 2])),
      *each("D-ls{:g}", "train.label_smoothing", _rates(train.label_smoothing, [0, 2])),
      # (E) Learned positional embeddings instead of sinusoids (3.5).
      ("E-learned", {"model.positional": "learned"}),
      # (big) N = 6, d_model = 1024, d_ff = 4096, h = 16, P_drop = 0.3, 300K steps at
      # the base's 512, 2048, 8, 0.1 and 100K (Table 3's last row; configs/big.py's
      # model and steps; checkpoints keep the base's cadence).
      ("big", {"model.d_model": 2 * model.d_model, "model.d_ff": 2 * model.d_ff,
               "model.num_heads": 2 * model.num_heads,
               "model.dropout": round(3 * model.dropout, 4),
               "train.num_steps": 3 * train.num_steps}),
      # Attention scoring functions in place of scaled dot-product (3.2.1): dot
      # (no 1/sqrt(d_k)), additive (Bahdanau) and general (Luong's x W y).
      *each("score-{}", "model.attention_score", ["dot", "additive", "general"]),
  ]

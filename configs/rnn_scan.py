"""SCAN 'simple' on the RNN encoder-decoder with Bahdanau attention, offline, on a CPU.

  python train.py --config configs/rnn_scan.py
  python -m transformer.evaluate --workdir runs/rnn_scan --split test --mode beam
Luong's attention instead: --config.model.rnn_attention=luong_general (or luong_dot),
with --config.model.rnn_cell=lstm for Luong's cell. The same data, vocabulary and
commands as configs/default.py (the Transformer), for a side-by-side comparison.
"""

from configs import default


def get_config():
  config = default.get_config()
  config.model.architecture = "rnn"  # transformer/rnn.py.
  config.model.rnn_cell = "gru"  # Bahdanau et al. 2015 used gated units of this kind.
  config.model.rnn_attention = "bahdanau"
  config.model.num_layers = 1  # One bidirectional encoder layer, one decoder layer (RNNsearch).
  config.model.d_model = 128  # Embeddings and decoder state; 64 units a direction.
  config.model.dropout = 0.1
  # Kept from the Transformer's config, which neither RNN paper had: one embedding
  # matrix for source and target, also the output projection (share_embeddings,
  # tie_output).

  # A recurrence carries its state from one token to the next, so packed rows (several
  # examples a row) are not possible: batches are rows of about the same length.
  config.data.batching = "bucket"
  config.data.tokens_per_batch = 4096  # Padded tokens a side; 73 rows of the longest bucket (56).

  # The section 5.3 schedule, kept for a like-for-like comparison: over this short run
  # its shape, a 200-step warmup to a constant-like peak and a slow 1/sqrt(step)
  # decay, is the "constant, then decay" that RNNs are usually trained with. Peak
  # lr = 0.6 * 128^-0.5 * 200^-0.5 = 3.8e-3, decaying to 1.1e-3 at step 2500.
  config.optim.warmup_steps = 200
  config.optim.learning_rate_scale = 0.6
  # Recurrent gradients can explode (Pascanu et al. 2013); Bahdanau et al. clipped
  # their norm at 1.
  config.optim.grad_clip_norm = 1.0

  config.train.num_steps = 2500
  config.train.eval_every = 500
  config.train.decode_every = 500
  return config

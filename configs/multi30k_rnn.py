"""Multi30k EN->DE on the RNN encoder-decoder with attention: the baseline beside
configs/multi30k.py (the Transformer): same data and vocabulary, same ~40 min here.

  python train.py --config configs/multi30k_rnn.py                  # Bahdanau (runs/multi30k_rnn)
  python train.py --config configs/multi30k_rnn.py:luong_general    # Luong, LSTM (runs/multi30k_rnn_luong_general)
  python -m transformer.evaluate --workdir runs/multi30k_rnn --split test_2016_flickr --mode beam
The argument after the file name picks config.model.rnn_attention, and so a workdir
of its own: bahdanau (default) | luong_general | luong_dot. Measured on the 2-core CPU
(40 min each): test_2016_flickr sacreBLEU 34.4 (Bahdanau), 36.2 (luong_general),
beam 4; the Transformer recipe 37.2; see README.
"""

from configs import multi30k
from transformer.config import RNN_ATTENTIONS


def get_config(attention="bahdanau"):
  if attention not in RNN_ATTENTIONS:
    raise ValueError(f"multi30k_rnn attention must be one of {RNN_ATTENTIONS}, got {attention!r}.")
  config = multi30k.get_config()
  config.model.architecture = "rnn"  # transformer/rnn.py.
  config.model.rnn_attention = attention
  # Bahdanau et al. used gated recurrent units, Luong et al. LSTMs with input feeding.
  config.model.rnn_cell = "gru" if attention == "bahdanau" else "lstm"
  config.model.rnn_input_feeding = True
  config.model.num_layers = 1  # One bidirectional encoder layer, one decoder layer (RNNsearch).
  config.model.d_model = 256  # Embeddings and decoder state; 128 units a direction.
  config.model.dropout = 0.2
  # Kept from the Transformer's recipe, which neither RNN paper had: one embedding
  # matrix for source and target, also the output projection (share_embeddings,
  # tie_output); the counts and BLEU above are with them.

  config.data.batching = "bucket"  # No packing: a recurrence would run across examples.
  config.data.tokens_per_batch = 4096  # Padded tokens a side.

  # The section 5.3 schedule as multi30k.py (the comparison changes only the model),
  # with the gradient-norm clip of Bahdanau et al. for the recurrence. Peak lr =
  # 0.7 * 256^-0.5 * 500^-0.5 = 2.0e-3, then 1/sqrt(step) decay: constant-like, then decay.
  config.optim.grad_clip_norm = 1.0

  # The same wall-clock budget as multi30k.py (~40 min here, evaluations included):
  # once its bucket shapes are compiled, a step of 4,096 padded tokens a side runs
  # at ~1.3 steps/s on the 2-core CPU (the Transformer's packed step: ~0.6), so
  # 3000 steps; validation every 500.
  config.train.num_steps = 3000
  config.train.eval_every = 500
  config.train.decode_every = 500
  return config

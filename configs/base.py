"""Transformer base (Table 3), WMT 2014 EN->DE with a shared 37k vocabulary.

  python train.py --config configs/base.py --workdir runs/base
The WMT data must be prepared once (the error message says how); see README.
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.seed = 0  # Seeds initialisation, dropout and the data order.

  config.model = model = ml_collections.ConfigDict()
  model.share_embeddings = True  # One matrix for source and target embeddings (3.4).
  model.tie_output = True  # The pre-softmax projection reuses the target embedding (3.4).
  model.num_layers = 6  # N: layers in the encoder and in the decoder (3.1).
  model.d_model = 512  # Width of every sub-layer output (3.1).
  model.d_ff = 2048  # Inner width of the feed-forward sub-layer (3.3).
  model.num_heads = 8  # h; d_k = d_v = d_model / h = 64 (3.2.2).
  model.d_k = 0  # Query/key size per head alone (Table 3 row B); 0 = d_model / h.
  model.dropout = 0.1  # P_drop on sub-layer outputs and embedding sums (5.4).
  model.attention_dropout = 0.0  # Dropout on attention probabilities (not in the paper).
  model.attention_bias = False  # Biases on W^Q, W^K, W^V, W^O (the paper's have none, 3.2.2).
  model.activation = "relu"  # relu (paper) | gelu | silu.
  model.norm_position = "post"  # post (paper): LayerNorm(x + Sublayer(x)) | pre.
  model.positional = "sinusoidal"  # sinusoidal (3.5) | learned (Table 3 row E).
  model.max_len = 256  # Positions the model can represent.
  # How queries meet keys: scaled_dot (3.2.1) | dot (unscaled, footnote 4) |
  # additive v^T tanh(W_q q + W_k k) (Bahdanau et al. 2015) | general q^T W k (Luong et al. 2015).
  model.attention_score = "scaled_dot"
  model.attention_impl = "fused"  # fused (jax.nn.dot_product_attention) | reference.
  # Compute dtype: auto (bfloat16 on GPU/TPU, float32 on CPU) | float32 | bfloat16.
  # Parameters, softmax, logits and loss stay float32 (transformer/mixed_precision.py).
  model.dtype = "auto"
  # transformer (this paper) | rnn: the recurrent encoder-decoder with attention it is
  # compared against (transformer/rnn.py; configs/rnn_scan.py, configs/multi30k_rnn.py).
  model.architecture = "transformer"
  model.rnn_cell = "gru"  # rnn: gru | lstm.
  # rnn: bahdanau (additive score of the previous state, Bahdanau et al. 2015) |
  # luong_general | luong_dot (multiplicative score of the current state, Luong et al. 2015).
  model.rnn_attention = "bahdanau"
  model.rnn_input_feeding = True  # rnn, luong_*: feed h~_{t-1} with the next input (Luong 3.3).
  # The special token ids are the vocabulary's, not settings: transformer/config.py.

  config.data = data = ml_collections.ConfigDict()
  data.dataset = "wmt14_translate/de-en"  # scan/simple | scan/length | parallel_text | a TFDS name.
  data.source_lang = "en"  # Translate from this language ...
  data.target_lang = "de"  # ... into this one.
  data.text_dir = ""  # parallel_text: folder of {split}.{lang}[.gz] files.
  data.tfds_data_dir = ml_collections.config_dict.placeholder(str)  # None: TFDS default.
  data.train_split = "train"  # Split to train on.
  data.eval_split = "validation"  # Split for evaluation during training (newstest2013).
  data.test_split = "test"  # newstest2014: evaluate's default split, sweep --collect's test column.
  data.vocab_path = ml_collections.config_dict.placeholder(str)  # SentencePiece model; None: train one.
  data.vocab_type = "bpe"  # SentencePiece model type: bpe | unigram | word.
  data.vocab_size = 37000  # Shared source/target vocabulary size (5.1).
  data.max_length = 256  # Longest example in tokens (eos included).
  data.overlong = "drop"  # Examples over max_length: drop | truncate.
  data.batching = "bucket"  # bucket: group by length (5.1) | pack: rows with segment ids.
  # About 25k source and 25k target tokens a batch (5.1): slots, padding included, so
  # the real tokens are somewhat fewer (bucketing keeps padding small).
  data.tokens_per_batch = 25000
  data.pack_length = 256  # Row length when batching = pack.
  data.pack_source_length = 0  # Source row length when packing; 0 = pack_length.
  data.prefetch = 2  # Batches prepared ahead in a background thread.

  config.optim = optim = ml_collections.ConfigDict()
  optim.learning_rate_scale = 1.0  # Multiplies the schedule of section 5.3.
  optim.warmup_steps = 4000  # Linear warmup steps of the schedule (5.3).
  optim.adam_b1 = 0.9  # Adam beta1 (5.3).
  optim.adam_b2 = 0.98  # Adam beta2 (5.3).
  optim.adam_eps = 1e-9  # Adam epsilon (5.3).
  optim.weight_decay = 0.0  # Decoupled weight decay (not in the paper).
  optim.grad_clip_norm = 0.0  # Global gradient-norm clip; 0 = off (not in the paper).

  config.train = train = ml_collections.ConfigDict()
  train.num_steps = 100_000  # Training steps of the base model (5.2).
  # eps_ls (5.4), as Szegedy et al. 2016 (which the paper cites) define it: 1 - eps on
  # the reference, eps / V on every class, the reference and PAD included.
  # tensor2tensor and fairseq put eps / (V - 1) on the other classes instead.
  train.label_smoothing = 0.1
  train.grad_accum_steps = 1  # Micro-batches summed into one update.
  # Device mesh: the batch is split over 'data'; attention heads and FFN hidden units
  # over 'model' (tensor parallelism, transformer/sharding.py). -1: the remaining
  # devices. The model axis must divide model.num_heads and model.d_ff, and fit in a host.
  train.mesh = "data=-1,model=1"
  train.fsdp = False  # Also shard parameters and optimizer state over the data axis.
  train.log_every = 100  # Steps between console/TensorBoard training metrics.
  train.eval_every = 5000  # Steps between evaluations on data.eval_split.
  train.decode_every = 10000  # Steps between decoding eval_split (BLEU / exact match); 0 = off.
  train.decode_examples = 1000  # Sentences decoded then; 0 = the whole split.
  train.decode_mode = "greedy"  # Search used then (greedy is faster; beam as in 6.1).
  # The paper wrote a checkpoint every 10 minutes and averaged the last 5 (base, 6.1);
  # at its 0.4 s a base step (5.2) that is every 1,500 steps: 6k steps from the first
  # averaged checkpoint to the last (7.5k counting the interval before the first).
  train.checkpoint_every = 1500
  train.keep_checkpoints = 5  # Checkpoints kept: the last 5 are averaged (6.1).

  config.decode = decode = ml_collections.ConfigDict()
  decode.beam_size = 4  # Beam width (6.1).
  decode.alpha = 0.6  # GNMT length penalty exponent (6.1).
  # Output length limit = input length + 50 (6.1), and at most model.max_len (the
  # decoder's positions): a source over max_len - 50 tokens gets less.
  decode.max_extra_len = 50
  # Source tokens per decoding batch; 0 = data.tokens_per_batch. A batch runs until
  # its slowest sentence is done and beams multiply its rows, so on a CPU small
  # batches are faster (Multi30k beam 4: 512 tokens 1.5x faster than 4096).
  decode.tokens_per_batch = 0
  # Beam search halves its batch up to this many times as sentences finish, so the
  # finished stop costing rows (the same outputs; search.beam_search). Each halving
  # compiles another loop: Multi30k test decodes 1.02x faster with 2 (1.06x one batch
  # at a time) but compiles 17 s longer (README), so it pays on large inputs
  # (evaluate/translate --compact 2). 0 = off.
  decode.compact = 0
  # Beam search takes batches this many times as large, searching as many sentences
  # at a time as a normal batch holds, each row starting the next sentence as soon as
  # its own stops (beam_loops.while_refilling; the outputs of the larger batch at once,
  # which in bfloat16 can round near-ties otherwise). Multi30k test, 8: 1.10x one
  # batch at a time (multi-process jobs, GPUs/TPUs), 1.01x two at a
  # time, compiling 1.4 s longer (evaluate/translate --refill 8). Transformer only;
  # not with compact. 0 = off.
  decode.refill = 0
  # Batches decoded at once, each from its own thread: one program leaves a CPU's
  # cores partly idle (Multi30k test on 2 cores: beam 4 1.37x, greedy 1.30x the
  # sentences/s of one at a time). The same outputs; each batch in flight holds its
  # own decoding cache. One in multi-process jobs and on GPUs/TPUs
  # (inference.batches_at_once).
  decode.concurrent_batches = 2

  # Multi-process jobs (README, Clusters): which processes make up the job comes from
  # the environment (transformer/distributed.py); these say how long to wait for them.
  config.distributed = distributed = ml_collections.ConfigDict()
  distributed.initialization_timeout_s = 300  # For every process to join at start-up.
  # Silence after which a process counts as dead and the whole job stops (not hangs).
  distributed.heartbeat_timeout_s = 100
  distributed.shutdown_timeout_s = 300  # For every process to reach the end at exit.
  return config

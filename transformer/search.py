"""Search algorithms over a step function: greedy, sampling and beam search
(Vaswani et al. 2017, sec. 6.1). They know nothing of models; transformer/decode.py
runs them over any model that implements its DecodingModel contract.

The searches drive a step function
    logits_fn(ids_Nx1, cache, step) -> (logits_NxV, new_cache)
where N is the batch (greedy, sampling) or batch*beam (beam search, batch-major:
row b*beam + k). Cache leaves have leading dim N; 0-dim leaves (e.g. a shared
cache index) are shared across rows and never gathered. Outputs never contain
BOS; after EOS a row holds PAD (= 0) only.

`max_len` is either a Python int or an int32[B] of per-row limits; with per-row
limits a static `out_len` (the buffer length L) must be given (it is inferred
for a concrete numpy array). Row b then emits at most min(max_len[b], L) tokens.

All three take grow=(first_len, grow_fn): the cache given holds first_len
steps, and grow_fn(cache) extends it to L if the loop gets that far.

How beam search's loop spends its rows on items that stop at different steps
(the whole batch, a shrinking one, or a refilled one) is transformer/beam_loops.py.

Beam scores use the GNMT length penalty with |Y| = generated tokens including
EOS. No search chooses PAD or BOS, nor a token whose logit is NaN, while any
other token is possible (`allowed`).
"""
import functools
from typing import Any, Callable, Optional, Tuple, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np

from transformer import beam_loops
from transformer.config import PAD_ID

NEG_INF = beam_loops.NEG_INF

Array = jax.Array
LogitsFn = Callable[[Array, Any, Array], Tuple[Array, Any]]
MaxLen = Union[int, np.ndarray, Array]


def _row_limits(max_len: MaxLen, batch_size: int,
                out_len: Optional[int]) -> Tuple[Array, int]:
  """Returns (max_len_B int32, static buffer length L)."""
  if out_len is None:
    if isinstance(max_len, (int, np.integer)):
      out_len = int(max_len)
    elif isinstance(max_len, np.ndarray):
      out_len = int(max_len.max())
    else:
      raise ValueError('a per-row jax max_len needs a static out_len')
  max_len_B = jnp.broadcast_to(jnp.asarray(max_len, jnp.int32), (batch_size,))
  return jnp.minimum(max_len_B, out_len), out_len


def argmax(x_NxV: Array) -> Array:
  """jnp.argmax over the last axis (the first maximum; the first NaN if any), int32.

  Two reductions, the maximum and then the lowest index holding it, that XLA's
  CPU backend vectorizes; its (value, index) reduction for argmax runs value by
  value, ~4x slower over a vocabulary, and greedy decoding takes one per step
  (benchmarks/README.md, 'Session 18').
  """
  V = x_NxV.shape[-1]
  max_Nx1 = jnp.max(x_NxV, axis=-1, keepdims=True)
  at_max_NxV = (x_NxV == max_Nx1) | jnp.isnan(x_NxV)  # max is NaN where any value is.
  return jnp.min(jnp.where(at_max_NxV, jnp.arange(V, dtype=jnp.int32)[None, :], V), axis=-1)


def allowed(logits_NxV: Array, bos_id: int, eos_id: int) -> Array:
  """The logits a search chooses from: PAD, BOS and NaN logits at -inf.

  PAD is the outputs' filler and BOS the decoder's first input: neither is a
  token of a sentence, yet an undertrained model can rank them first, and then
  lengths and the length penalty count them. A NaN (a diverged model) would win
  an argmax. BOS stays allowed where it is also the EOS. (A row with nothing
  left, every logit NaN, gets argmax's token 0, PAD.)
  """
  ids_1xV = jnp.arange(logits_NxV.shape[-1])[None, :]
  banned_1xV = (ids_1xV == PAD_ID) | ((ids_1xV == bos_id) & (bos_id != eos_id))
  return jnp.where(banned_1xV | jnp.isnan(logits_NxV), NEG_INF, logits_NxV)


def _choose_greedy(logits_NxV: Array, step: Array) -> Array:
  del step
  return argmax(logits_NxV)


def _while(cond_fn, body_fn, state, out_len: int, grow):
  """while cond_fn(state) and t < out_len: state = body_fn(state).

  With grow = (first_len, grow_fn) the cache starts with first_len positions:
  the loop runs to t = first_len on it, then grow_fn(cache) extends it to
  out_len and the loop goes on. Most batches end well before out_len, and a
  shorter cache is cheaper to attend over and to reorder at every step.
  """
  def run(state, length):
    return jax.lax.while_loop(lambda s: (s.t < length) & cond_fn(s), body_fn, state)

  if grow is None or grow[0] >= out_len:
    return run(state, out_len)
  first_len, grow_fn = grow
  state = run(state, first_len)
  return run(state.replace(cache=grow_fn(state.cache)), out_len)


@flax.struct.dataclass
class LoopState:
  """Greedy and sampling: one token per row per step."""
  t: Array  # int32 scalar: the step.
  last: Array  # int32[B]: each row's last token (BOS at the start).
  ids: Array  # int32[B, L]: the output so far.
  finished: Array  # bool[B]: the row has emitted EOS.
  cache: Any


def _decode_loop(logits_fn: LogitsFn, cache: Any, choose_fn, *, batch_size: int,
                 max_len: MaxLen, bos_id: int, eos_id: int,
                 out_len: Optional[int], grow=None) -> Array:
  """One-token-per-step decoding loop shared by greedy and sampling -> ids_BxL."""
  max_len_B, L = _row_limits(max_len, batch_size, out_len)

  def done_fn(t, finished_B):
    return finished_B | (t >= max_len_B)

  def body_fn(s):
    t = s.t
    logits_BxV, cache = logits_fn(s.last[:, None], s.cache, t)
    done_B = done_fn(t, s.finished)
    # Done rows still flow through logits_fn (fixed shapes) but emit PAD.
    tok_B = jnp.where(done_B, PAD_ID, choose_fn(allowed(logits_BxV, bos_id, eos_id), t))
    return LoopState(t=t + 1, last=tok_B, ids=s.ids.at[:, t].set(tok_B),
                     finished=s.finished | (~done_B & (tok_B == eos_id)), cache=cache)

  init = LoopState(t=jnp.int32(0), last=jnp.full((batch_size,), bos_id, jnp.int32),
                   ids=jnp.full((batch_size, L), PAD_ID, jnp.int32),
                   finished=jnp.zeros((batch_size,), bool), cache=cache)
  return _while(lambda s: ~jnp.all(done_fn(s.t, s.finished)), body_fn, init, L, grow).ids


def greedy_search(logits_fn: LogitsFn, cache: Any, *, batch_size: int,
                  max_len: MaxLen, bos_id: int, eos_id: int,
                  out_len: Optional[int] = None, grow=None) -> Array:
  """Argmax decoding -> ids_BxL (no BOS; PAD after EOS and past each row's max_len)."""
  return _decode_loop(logits_fn, cache, _choose_greedy, batch_size=batch_size,
                      max_len=max_len, bos_id=bos_id, eos_id=eos_id,
                      out_len=out_len, grow=grow)


def sample(logits_fn: LogitsFn, cache: Any, rng: Array, *, batch_size: int,
           max_len: MaxLen, bos_id: int, eos_id: int, temperature: float = 1.0,
           top_k: int = 0, out_len: Optional[int] = None, grow=None) -> Array:
  """Temperature / top-k sampling -> ids_BxL.

  temperature == 0 (a Python number) is argmax; top_k (static) = 0 keeps the
  full vocabulary. `rng` is one key a row (a key array of shape [B]), or a key
  whose row b gets fold_in(rng, b); row b's token at step t is drawn with
  fold_in(its key, t), so that its samples do not depend on the rest of the batch.
  """
  if isinstance(temperature, (int, float)) and temperature == 0:
    return greedy_search(logits_fn, cache, batch_size=batch_size,
                         max_len=max_len, bos_id=bos_id, eos_id=eos_id,
                         out_len=out_len, grow=grow)

  if not jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
    rng = jax.random.wrap_key_data(rng)  # A raw uint32 key (jax.random.PRNGKey).
  keys_B = rng if jnp.ndim(rng) else row_keys(rng, jnp.arange(batch_size))
  if isinstance(temperature, (int, float)):  # float32's largest: no overflow in the cast.
    temperature = min(temperature, float(np.finfo(np.float32).max))

  def choose_fn(logits_NxV, t):
    logits_NxV = logits_NxV.astype(jnp.float32)
    if top_k > logits_NxV.shape[-1]:
      raise ValueError(f"top_k={top_k} is larger than the vocabulary ({logits_NxV.shape[-1]})")
    if top_k > 0:  # Exactly k: of tokens tied with the k-th, the lowest ids, as argmax.
      top_NxK = jax.lax.top_k(logits_NxV, top_k)[1]
      rows_Nx1 = jnp.arange(logits_NxV.shape[0])[:, None]
      keep_NxV = jnp.zeros(logits_NxV.shape, bool).at[rows_Nx1, top_NxK].set(True)
      logits_NxV = jnp.where(keep_NxV, logits_NxV, NEG_INF)
    # Shifted to a maximum of 0 first: a tiny temperature then sends the others to
    # -inf, not every logit to +-inf (where the draw would be token 0).
    shifted_NxV = logits_NxV - jnp.max(logits_NxV, axis=-1, keepdims=True)
    # Masked tokens stay masked at any temperature: XLA divides by multiplying by
    # 1/temperature, 0 in float32 past ~1e38, and -inf * 0 is NaN (every draw was
    # then token 0, PAD: empty outputs).
    scaled_NxV = jnp.where(shifted_NxV == NEG_INF, NEG_INF, shifted_NxV / temperature)
    draw = lambda key, logits_V: jax.random.categorical(jax.random.fold_in(key, t), logits_V)
    return jax.vmap(draw)(keys_B, scaled_NxV).astype(jnp.int32)

  return _decode_loop(logits_fn, cache, choose_fn, batch_size=batch_size,
                      max_len=max_len, bos_id=bos_id, eos_id=eos_id,
                      out_len=out_len, grow=grow)


def row_keys(rng: Array, ids_B: Array) -> Array:
  """One sampling key a row: fold_in(rng, id) of each row's id."""
  return jax.vmap(lambda i: jax.random.fold_in(rng, i))(ids_B)


def _chunk_width(V: int) -> int:
  """The largest divisor of V from 64 to 128, so that no padded copy of the
  logits is written out (XLA writes one for the padding); else 128."""
  return next((w for w in range(128, 63, -1) if V % w == 0), 128)


def top_log_probs(logits_BxKxV: Array, offset_BxK: Array, k: int,
                  chunk: Optional[int] = None) -> Tuple[Array, Array]:
  """jax.lax.top_k over the [B, K*V] scores log_softmax(logits) + offset (beam
  search's candidates: each item's K beams' log-probabilities of every next
  token, plus the beams' own), with its values and indices (ties to the lower
  index), without the [B, K, V] scores written out.

  The logits are read twice: for the maxima of chunks of `chunk` values (by
  default a divisor of V), and for the sums of exponentials. Along a beam's row
  the score ((x - max) - logsumexp) + offset is a non-decreasing function of the
  logit x, also as rounded in float32, so a chunk's largest logit has its
  largest score. Only the k chunks with the largest maxima can hold the top k
  (each chunk holding one of them has a maximum at least the k-th largest score,
  and at most k chunks do, ties going to the lower chunk as they go to the lower
  index), so only those k * chunk scores are computed, in jax.nn.log_softmax's
  arithmetic. XLA's CPU TopK is a serial scan of its row, ~1.7 ns a value
  (benchmarks/README.md, 'Measurements behind the code').
  """
  B, K, V = logits_BxKxV.shape
  x_BxKxV = logits_BxKxV.astype(jnp.float32)
  W = chunk or _chunk_width(V)
  C = -(-V // W)

  def score(x, max_, lse, offset):
    return ((x - max_) - lse) + offset

  def all_scores():
    logp_BxKxV = jax.nn.log_softmax(x_BxKxV) + offset_BxK[:, :, None]
    return tuple(jax.lax.top_k(logp_BxKxV.reshape(B, K * V), k))

  if K * C <= 2 * k:
    return all_scores()
  chunk_max_BxKxC = jnp.max(jnp.pad(x_BxKxV, ((0, 0), (0, 0), (0, C * W - V)),
                                    constant_values=-jnp.inf).reshape(B, K, C, W), axis=3)
  max_BxK = jnp.max(chunk_max_BxKxC, axis=2)
  lse_BxK = jnp.log(jnp.sum(jnp.exp(x_BxKxV - max_BxK[:, :, None]), axis=2))
  chunk_score_BxKC = score(chunk_max_BxKxC, max_BxK[:, :, None], lse_BxK[:, :, None],
                           offset_BxK[:, :, None]).reshape(B, K * C)
  # In index order, for the order of ties.
  chunks_Bxk = jnp.sort(jax.lax.top_k(chunk_score_BxKC, k)[1], axis=1)
  beam_Bxk = chunks_Bxk // C
  v_BxkxW = (chunks_Bxk % C)[:, :, None] * W + jnp.arange(W)[None, None, :]
  idx_BxkW = (beam_Bxk[:, :, None] * V + v_BxkxW).reshape(B, k * W)
  x_BxkxW = _take(x_BxKxV.reshape(B, K * V), jnp.minimum(idx_BxkW, K * V - 1)).reshape(B, k, W)
  row = lambda stat_BxK: _take(stat_BxK, beam_Bxk)[:, :, None]
  scores_BxkxW = jnp.where(v_BxkxW < V, score(x_BxkxW, row(max_BxK), row(lse_BxK), row(offset_BxK)),
                           -jnp.inf)
  values_Bxk, pos_Bxk = jax.lax.top_k(scores_BxkxW.reshape(B, k * W), k)
  top = values_Bxk, _take(idx_BxkW, pos_Bxk)
  if C * W == V:
    return top
  # A padding slot sits before the next beam's chunks, so where fewer than k
  # scores are above -inf it could win a tie at -inf: then all scores decide.
  return jax.lax.cond(jnp.any(values_Bxk[:, -1] == -jnp.inf), all_scores, lambda: top)


def length_penalty(length, alpha) -> Array:
  """GNMT length penalty lp(|Y|) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016)."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def _take(x_BxMx, idx_BxK: Array) -> Array:
  """x[b, idx[b, k], ...] for x with any number of trailing dims."""
  idx = idx_BxK.reshape(idx_BxK.shape + (1,) * (x_BxMx.ndim - 2))
  return jnp.take_along_axis(x_BxMx, idx, axis=1)


def gather_beams(tree: Any, parent_BxK: Array) -> Any:
  """Reorders every leaf with leading dim N = B*K by parent beam; 0-dim leaves kept.

  Gathers within each item ([B, K, ...] view, batched over B), so a batch-
  sharded cache stays local to its device.
  """
  B, K = parent_BxK.shape

  def gather(x):
    if x.ndim == 0:
      return x
    return _take(x.reshape((B, K) + x.shape[1:]), parent_BxK).reshape(x.shape)

  return jax.tree.map(gather, tree)


def beam_search(logits_fn: LogitsFn, cache: Any, *, batch_size: int,
                beam_size: int, alpha: float, max_len: MaxLen, bos_id: int,
                eos_id: int, out_len: Optional[int] = None,
                best_only: bool = False, grow=None,
                reorder_fn: Callable[[Any, Array], Any] = gather_beams,
                compact: int = 0,
                refill: Optional[Callable[[Any, Array, Array], Any]] = None,
                ring=None) -> Tuple[Array, Array]:
  """Beam search with the GNMT length penalty -> (ids_BxKxL, scores_BxK), best first.

  score(Y) = log P(Y) / lp(|Y|), where |Y| counts the generated tokens
  INCLUDING the final EOS (BOS excluded), as in tensor2tensor/Flax.
  Per step the top 2K extensions are taken so that K of them do not end in
  EOS: those stay alive; an EOS extension that ranks among the top K of the
  step competes for the K finished slots (lower-ranked ones would not have
  been in the beam, as in fairseq). A batch item stops (its state is frozen)
  at its max_len, or once no alive beam can ever beat its worst finished one:
  alive log-probs only fall and, for alpha >= 0, lp grows with the length, so
  best_alive_logp / lp(max_len) bounds any score still to come (the admissible
  rule of tensor2tensor's beam search). The result is then the one of a search
  that runs every item to its max_len. With K = 1 and alpha = 0 this is greedy
  search; with alpha > 0 the single beam may run past an EOS greedy stops at.
  PAD, BOS and NaN logits count as -inf (`allowed`): they are never chosen, and
  the log-softmax normalizes over the other tokens. With best_only, only row 0
  of each item is wanted: an item also stops once its best finished hypothesis
  beats that bound, even with empty finished slots (row 0 is then final; the
  other rows may not be the K best).
  Output: finished hypotheses (ending in EOS, PAD after) sorted by score, then,
  to fill the K rows, alive ones (no EOS, score = logp / lp(their length)):
  an item with nothing finished returns its alive beams.
  The cache must have N = batch_size * beam_size rows (batch-major);
  reorder_fn(cache, parent_BxK) picks each new beam's parent row (default
  gather_beams). With compact = n > 0 the loop halves its batch up to n times
  as items finish (beam_loops.while_compacting): logits_fn and reorder_fn then
  also see fewer rows, and every cache leaf with a leading dim must be per-row.
  With refill = restart_fn (best_only; no grow or compact), `max_len` gives the
  limits of a pool of P items (an int32[P]), which the B = batch_size items'
  rows work through (beam_loops.while_refilling): restart_fn(cache, slot, item)
  gives a slot's K cache rows to pool item `item` (a scalar of each). The cache is then
  a ring (slot = step mod its length) of L steps, or with ring = (first_len,
  ring_fn) of first_len, made a ring of `length` by ring_fn(cache, length) while
  needed. The output is the P items' best hypotheses, ids_Px1xL and scores_Px1.
  """
  if refill is not None and (compact or grow is not None or not best_only
                             or np.ndim(max_len) != 1):
    raise ValueError("a refilling beam search takes the pool's limits (int32[P]), no "
                     "compact or grow (but a ring), and returns the best hypotheses only "
                     "(best_only=True)")
  B, K = batch_size, beam_size
  max_len_B, L = _row_limits(max_len, B if refill is None else np.shape(max_len)[0], out_len)

  def stop_fn(s):
    t = s.t - s.start  # The item's own step.
    live_best_B = s.live_logp[:, 0]
    # Future finished lengths lie in [t+1, max_len]; lp is monotone, so the
    # largest penalty (the best score for logp < 0) is at one end.
    lp_best_B = jnp.maximum(length_penalty(t + 1, alpha),
                            length_penalty(s.limit, alpha))
    fin_B = (jnp.max if best_only else jnp.min)(
        jnp.where(s.fin_ok, s.fin_score, NEG_INF), axis=1)
    # Without best_only all K finished hypotheses must be final (the worst one
    # beats the bound; an empty slot is -inf); with it, the best one alone.
    return ((t >= s.limit) | (live_best_B == NEG_INF)
            | (fin_B > live_best_B / lp_best_B))

  def done_fn(s):
    # Sticky: the tests above depend on t, and a stopped item's state is frozen,
    # so they could turn false again later; a stopped item never restarts.
    return s.done | stop_fn(s)

  def body_fn(s):
    t = s.t - s.start  # The items' step: shared, or each its own when refilling.
    B = s.done.shape[0]  # Fewer than batch_size once compacted.
    done_B = done_fn(s)
    active_B = ~done_B
    logits_NxV, cache = logits_fn(s.last.reshape(B * K, 1), s.cache, s.t)
    V = logits_NxV.shape[-1]
    # PAD, BOS and a NaN logit are tokens never chosen (a NaN makes no NaN row).
    # The select also keeps XLA's CPU backend from fusing the log-softmax's
    # reductions into the logits product, where they ran ~4x slower than apart
    # (benchmarks/README.md).
    logits_NxV = allowed(logits_NxV, bos_id, eos_id)
    # 2K candidates guarantee K that do not end in EOS.
    cand_logp_Bx2K, cand_idx_Bx2K = top_log_probs(logits_NxV.reshape(B, K, V), s.live_logp, 2 * K)
    cand_parent_Bx2K = cand_idx_Bx2K // V
    cand_tok_Bx2K = (cand_idx_Bx2K % V).astype(jnp.int32)
    cand_seqs_Bx2KxL = _write_at(_take(s.live_seqs, cand_parent_Bx2K), t, cand_tok_Bx2K)
    cand_eos_Bx2K = cand_tok_Bx2K == eos_id

    # Alive: the best K candidates not ending in EOS.
    live_logp_BxK, sel_BxK = jax.lax.top_k(
        jnp.where(cand_eos_Bx2K, NEG_INF, cand_logp_Bx2K), K)
    parent_BxK = _take(cand_parent_Bx2K, sel_BxK)

    # Finished: merge the EOS candidates into the K finished slots (old ones
    # first, so ties keep the earlier hypothesis).
    in_beam_Bx2K = jnp.broadcast_to(jnp.arange(2 * K) < K, (B, 2 * K))  # top_k sorts
    cand_ok_Bx2K = cand_eos_Bx2K & (cand_logp_Bx2K > NEG_INF) & in_beam_Bx2K
    cand_score_Bx2K = jnp.where(cand_ok_Bx2K,
                                cand_logp_Bx2K / _per_item(length_penalty(t + 1, alpha)), NEG_INF)
    all_score_Bx3K = jnp.concatenate([s.fin_score, cand_score_Bx2K], axis=1)
    fin_score_BxK, fin_sel_BxK = jax.lax.top_k(all_score_Bx3K, K)
    fin_ok_BxK = _take(jnp.concatenate([s.fin_ok, cand_ok_Bx2K], axis=1), fin_sel_BxK)
    fin_seqs_BxKxL = _take(jnp.concatenate([s.fin_seqs, cand_seqs_Bx2KxL], axis=1),
                           fin_sel_BxK)

    # Done items keep their state, so an item's result does not depend on
    # how long the other items of the batch keep the loop running.
    keep = functools.partial(beam_loops.where_items, active_B)

    parent_BxK = keep(parent_BxK, jnp.broadcast_to(jnp.arange(K, dtype=parent_BxK.dtype), (B, K)))
    return beam_loops.BeamState(
        t=s.t + 1,
        start=s.start,
        done=done_B,
        steps=s.steps + active_B.astype(jnp.int32),
        live_logp=keep(live_logp_BxK, s.live_logp),
        live_seqs=keep(_take(cand_seqs_Bx2KxL, sel_BxK), s.live_seqs),
        last=keep(_take(cand_tok_Bx2K, sel_BxK), s.last),
        fin_score=keep(fin_score_BxK, s.fin_score),
        fin_ok=keep(fin_ok_BxK, s.fin_ok),
        fin_seqs=keep(fin_seqs_BxKxL, s.fin_seqs),
        limit=s.limit,
        # The cache is reordered by the chosen parents, never recomputed.
        cache=reorder_fn(cache, parent_BxK.astype(jnp.int32)),
    )

  if refill is not None:  # max_len: the pool's limits.
    return beam_loops.while_refilling(done_fn, body_fn, lambda s: _results(s, alpha), cache,
                                      B, K, L, max_len_B, refill, bos_id,
                                      None if ring is None or ring[0] >= L else ring)
  init = beam_loops.BeamState(t=jnp.int32(0), start=jnp.int32(0), cache=cache,
                              **beam_loops.fresh_items(B, K, L, bos_id, max_len_B))
  if compact:
    s = beam_loops.while_compacting(done_fn, body_fn, init, L, grow, K, compact)
  else:
    s = _while(lambda s: ~jnp.all(done_fn(s)), body_fn, init, L, grow)
  return _results(s, alpha)


def _results(s: beam_loops.BeamState, alpha) -> Tuple[Array, Array]:
  """(ids_BxKxL, scores_BxK): finished hypotheses first, best first, then alive ones."""
  K = s.live_logp.shape[1]
  live_score_BxK = s.live_logp / length_penalty(s.steps, alpha)[:, None]
  score_Bx2K = jnp.concatenate([s.fin_score, live_score_BxK], axis=1)
  ok_Bx2K = jnp.concatenate([s.fin_ok, jnp.zeros_like(s.fin_ok)], axis=1)
  # Finished first, then by score; empty finished slots (-inf) sort last.
  order_BxK = jnp.lexsort((-score_Bx2K, ~ok_Bx2K), axis=-1)[:, :K]
  seqs_Bx2KxL = jnp.concatenate([s.fin_seqs, s.live_seqs], axis=1)
  return _take(seqs_Bx2KxL, order_BxK), _take(score_Bx2K, order_BxK)


def _per_item(x: Array) -> Array:
  """A per-item [B] value as a column [B, 1]; a shared scalar as it is."""
  return x[:, None] if jnp.ndim(x) else x


def _write_at(x_BxMxL: Array, t: Array, value_BxM: Array) -> Array:
  """x[b, m, t_b] = value[b, m], t the shared step or each item's own (int32[B])."""
  if jnp.ndim(t) == 0:
    return x_BxMxL.at[:, :, t].set(value_BxM)
  at_t_Bx1xL = jnp.arange(x_BxMxL.shape[2])[None, None, :] == t[:, None, None]
  return jnp.where(at_t_Bx1xL, value_BxM[:, :, None], x_BxMxL)

"""Scores of detokenized outputs against references: sacreBLEU for translation,
exact match and token accuracy for SCAN."""

from sacrebleu.metrics import BLEU, CHRF


def sequence_accuracy(hypotheses, references):
  """SCAN metrics on whitespace tokens: exact_match (whole sequence equal) and
  token_accuracy, position-wise over the reference length: hypothesis token i is
  right if it equals reference token i; missing tokens are wrong, extra ones ignored."""
  exact = correct = total = 0
  for hyp, ref in zip(hypotheses, references):
    h, r = hyp.split(), ref.split()
    exact += h == r
    correct += sum(a == b for a, b in zip(h, r))
    total += len(r)
  return {"exact_match": exact / len(references),
          "token_accuracy": correct / max(total, 1)}


def corpus_bleu(hypotheses, references):
  """sacreBLEU corpus BLEU (cased, 13a, exp smoothing) and chrF, with signatures."""
  bleu, chrf = BLEU(), CHRF()
  b = bleu.corpus_score(list(hypotheses), [list(references)])
  c = chrf.corpus_score(list(hypotheses), [list(references)])
  return {"bleu": b.score, "bleu_precisions": list(b.precisions),
          "bleu_brevity_penalty": b.bp, "bleu_length_ratio": b.ratio,
          "hyp_length": b.sys_len, "ref_length": b.ref_len, "chrf": c.score,
          "bleu_signature": str(bleu.get_signature()),
          "chrf_signature": str(chrf.get_signature())}


def main_metric(dataset: str) -> str:
  """The figure a dataset is judged by (the 'best' checkpoint's): exact match for
  SCAN, BLEU for translation."""
  return "exact_match" if dataset.startswith("scan") else "bleu"


def score(hypotheses, references, task):
  """Metrics of detokenized outputs against references: sequence_accuracy when
  `task` (the dataset name) is SCAN, else corpus_bleu (see main_metric)."""
  hypotheses, references = list(hypotheses), list(references)
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
  if not references:
    raise ValueError("nothing to score: no references")
  if main_metric(task) == "exact_match":
    return sequence_accuracy(hypotheses, references)
  return corpus_bleu(hypotheses, references)

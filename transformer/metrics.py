"""Scores of detokenized outputs against references: sacreBLEU for translation,
exact match and token accuracy for SCAN, over a whole corpus (`score`) or
accumulated chunk by chunk (`Scorer`) with the same result."""

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.utils import sum_of_lists


def main_metric(dataset: str) -> str:
  """The figure a dataset is judged by (the 'best' checkpoint's): exact match for
  SCAN, BLEU for translation."""
  return "exact_match" if dataset.startswith("scan") else "bleu"


class Scorer:
  """Corpus scores from sums of per-sentence statistics, added a chunk at a time,
  so that a split need not be held in memory to be scored.

  SCAN (`task`, the dataset name, starting with 'scan'): exact_match (whole
  sequence equal) and token_accuracy on whitespace tokens, position-wise over
  the reference length (hypothesis token i is right if it equals reference token
  i; missing tokens are wrong, extra ones ignored). Translation: sacreBLEU's
  corpus BLEU (cased, 13a, exp smoothing) and chrF with their signatures. Its
  corpus_score sums the same per-sentence statistics (_extract_corpus_statistics,
  _aggregate_and_compute) over one list; they are private to sacreBLEU, whose
  version requirements.txt pins, and tests/test_evaluate.py checks the sums
  against corpus_score.
  """

  def __init__(self, task: str):
    self.sequences = main_metric(task) == "exact_match"
    self.count = 0
    self._sums = None
    self._metrics = () if self.sequences else (BLEU(), CHRF())

  def add(self, hypotheses, references) -> None:
    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
      raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not references:
      return
    if self.sequences:
      sums = [0, 0, 0]  # Exact, correct tokens, reference tokens.
      for hyp, ref in zip(hypotheses, references):
        h, r = hyp.split(), ref.split()
        sums[0] += h == r
        sums[1] += sum(a == b for a, b in zip(h, r))
        sums[2] += len(r)
      sums = [sums]
    else:
      sums = [sum_of_lists(m._extract_corpus_statistics(hypotheses, [references]))  # pylint: disable=protected-access
              for m in self._metrics]
    self._sums = sums if self._sums is None else [
        sum_of_lists([a, b]) for a, b in zip(self._sums, sums)]
    self.count += len(references)

  def result(self) -> dict:
    if not self.count:
      raise ValueError("nothing to score: no references")
    if self.sequences:
      exact, correct, total = self._sums[0]
      return {"exact_match": exact / self.count, "token_accuracy": correct / max(total, 1)}
    (bleu, chrf), (b, c) = self._metrics, [
        m._aggregate_and_compute([s]) for m, s in zip(self._metrics, self._sums)]  # pylint: disable=protected-access
    return {"bleu": b.score, "bleu_precisions": list(b.precisions),
            "bleu_brevity_penalty": b.bp, "bleu_length_ratio": b.ratio,
            "hyp_length": b.sys_len, "ref_length": b.ref_len, "chrf": c.score,
            "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature())}


def score(hypotheses, references, task):
  """Metrics of detokenized outputs against references, the corpus as one chunk
  (see Scorer)."""
  scorer = Scorer(task)
  scorer.add(hypotheses, references)
  return scorer.result()

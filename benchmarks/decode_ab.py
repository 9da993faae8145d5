"""Decoding settings compared on a trained model: an interleaved A/B in one process.

  python -m benchmarks.decode_ab --workdir runs/multi30k --split test_2016_flickr \
      --variant compact=0 --variant compact=2 [--mode beam] [--runs 3] [--json out.json]

Each --variant overrides config.decode fields (comma-separated name=value) of the
workdir's config: fields it has, or that a current config has (configs/base.py;
a workdir saved before decode.compact existed lacks it), checked as evaluate
checks its flags, all before any decoding. Each variant first decodes the whole
split once, in turn, untimed: that warm-up compiles it (its compile time is
reported) and is cold, the first variant's most (it also builds what the later
ones reuse), so counted it would skew the median and "vs first". Then each of
--runs decodes the whole split once per variant, in turn, all warm, so the
variants share the machine's state. The outputs of every variant must equal
the first variant's: a setting meant as a pure speed-up that changes a
hypothesis fails here, unless --allow_changes, which counts them instead (in
bfloat16, batches of other shapes round differently and can move near-ties).
"""

import argparse
import ast
import json
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

if __name__ == "__main__":  # Before JAX starts; see transformer/runtime.py.
  from transformer import runtime
  runtime.use_fast_malloc()

from benchmarks import common  # pylint: disable=g-import-not-at-top
from configs import base as base_config  # pylint: disable=g-import-not-at-top
from transformer import data as data_lib  # pylint: disable=g-import-not-at-top
from transformer import evaluate, inference, runtime, saved_config  # pylint: disable=g-import-not-at-top
from transformer import workdir as workdir_lib  # pylint: disable=g-import-not-at-top


def parse_variant(text):
  """'compact=2,tokens_per_batch=1024' -> {'compact': 2, 'tokens_per_batch': 1024}."""
  fields = {}
  for item in filter(None, text.split(",")):
    name, sep, value = item.partition("=")
    if not sep or not name:
      raise ValueError(f"--variant {text!r}: {item!r} is not name=value")
    try:
      fields[name] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      fields[name] = value
  return fields


def with_decode(config, fields, text):
  """A copy of `config` with config.decode fields set, of --variant `text`: fields
  the workdir's config has, or that a current one has (configs/base.py), which a
  workdir saved before they existed lacks (decode.compact: A/B on an old run); a
  value of another type than the field's is refused. Any other name is a typo,
  which would be decoded as the unchanged config and timed as a variant."""
  current = base_config.get_config().decode
  config = config.copy_and_resolve_references()
  with config.unlocked():
    for name, value in fields.items():
      if name not in config.decode:
        if name not in current:
          known = sorted(set(config.decode) | set(current))
          raise ValueError(f"--variant {text!r}: config.decode has no field {name!r} "
                           f"(fields: {', '.join(known)})")
        config.decode[name] = current[name]  # Its type, for the check below.
      try:
        config.decode[name] = value
      except TypeError as e:  # ml_collections: the value cannot take the field's type.
        raise ValueError(f"--variant {text!r}: {name}={value!r}: {runtime.first_line(e)}"
                         ) from None
  return config


def check_variant(config, mode, text):
  """A ValueError naming --variant `text` for a config.decode setting out of range:
  the search settings as evaluate checks its flags (refill by architecture too),
  the rest as a workdir's config.json is checked (saved_config.check_saved: a decode
  field since removed, which an older workdir may hold, goes unread)."""
  try:
    evaluate.search_settings("decode_ab", config, mode)
    saved_config.check_saved(config.to_dict())
  except ValueError as e:
    raise ValueError(f"--variant {text!r}: {runtime.first_line(e)}") from None


def decode(restored, examples, config, mode):
  """(output ids as lists, timings) of one decode of `examples` under `config`."""
  got = {}
  ids = inference.decode_ids(restored.model, restored.params, examples, config, restored.mesh,
                             mode=mode, timings=got, **inference.decode_settings(config))
  return [row.tolist() for row in ids], got


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--split", default=None, help="default config.data.test_split")
  parser.add_argument("--checkpoint", default="latest")
  parser.add_argument("--mode", default="beam", choices=("greedy", "beam"))
  parser.add_argument("--variant", action="append", required=True,
                      help="config.decode overrides, e.g. compact=0 (repeat the flag)")
  parser.add_argument("--runs", type=int, default=3,
                      help="timed runs, after one untimed warm-up decode of each variant")
  parser.add_argument("--limit", type=int, default=None, help="the first N sentences only")
  parser.add_argument("--json", default=None)
  parser.add_argument("--allow_changes", action="store_true",
                      help="count outputs that differ from the first variant's, not fail")
  args = parser.parse_args(argv)
  # Checked before any work: --runs 0 has no median, --limit -5 would slice off
  # the last 5 sentences, and a bad --json path would fail after the benchmark.
  common.check_flags(parser, args, least=dict.fromkeys(("runs", "limit"), 1),
                     outputs=("json",))
  with runtime.one_line_errors("decode_ab"):
    return run(args)


def run(args):
  """The benchmark of parsed flags `args`; returns the JSON's dict."""
  # Orbax's read-only notice and INFO lines, as evaluate drops them; no compilation
  # cache, so that every variant's compile time is measured.
  runtime.quiet_library_logs()
  fields = {text: parse_variant(text) for text in args.variant}
  config = workdir_lib.load_config(args.workdir)
  workdir_lib.checkpoint_location(args.workdir, args.checkpoint)  # A bad name fails here.
  variants = {text: with_decode(config, fields[text], text) for text in args.variant}
  for text, variant_config in variants.items():  # Every variant, before the first decodes.
    check_variant(variant_config, args.mode, text)
  split = args.split or config.data.test_split
  tokenizer = workdir_lib.load_tokenizer(args.workdir, config)
  # One chunk: the whole split (or its first --limit examples).
  first = next(data_lib.iter_eval(config.data, tokenizer, split, 10**9, args.limit,
                                  field="--split" if args.split else "config.data.test_split"),
               None)
  if not first or not first[0]:
    raise ValueError(f"split {split!r} of {config.data.dataset} has no examples")
  examples = first[0]
  restored = workdir_lib.restore(args.workdir, args.checkpoint)
  warmups = {}
  timings = {text: [] for text in variants}
  changes = {text: 0 for text in variants}
  reference = None
  for run_index in range(-1, args.runs):  # -1: the untimed warm-up.
    for text, variant_config in variants.items():
      ids, got = decode(restored, examples, variant_config, args.mode)
      if reference is None:
        reference = ids
      elif ids != reference:
        changes[text] = sum(a != b for a, b in zip(ids, reference))
        if not args.allow_changes:
          raise runtime.CommandError(
              f"variant {text!r} changed {changes[text]} of {len(ids)} outputs")
      rate = len(ids) / got["decode_seconds"]
      if run_index < 0:
        warmups[text] = got
        print(f"{text}: warm-up, not counted: {rate:.1f} sentences/s "
              f"(compile {got['compile_seconds']:.1f} s)", flush=True)
      else:
        timings[text].append(got)
        print(f"{text}: {rate:.1f} sentences/s", flush=True)

  n = len(examples)
  rows = []
  for text, runs in timings.items():
    rates = [n / t["decode_seconds"] for t in runs]
    rows.append({"variant": text, "sentences_per_second": rates,
                 "median": statistics.median(rates),
                 "compile_seconds": warmups[text]["compile_seconds"],
                 "warmup_sentences_per_second": n / warmups[text]["decode_seconds"],
                 "changed_outputs": changes[text]})
  base = rows[0]["median"]
  print(f"\n{split}, {n} sentences, {args.mode}, {args.runs} runs timed after a warm-up "
        "decode of each variant; "
        + ("outputs identical" if not any(changes.values()) else
           "outputs changed from the first variant's: " + ", ".join(
               f"{t}: {c}" for t, c in changes.items() if c)))
  print("| variant | sentences/s (each timed run) | median | vs first | compile s (warm-up) |")
  print("|---|---|---:|---:|---:|")
  for row in rows:
    each = ", ".join(f"{r:.1f}" for r in row["sentences_per_second"])
    print(f"| {row['variant']} | {each} | {row['median']:.1f} | "
          f"{row['median'] / base:.2f}x | {row['compile_seconds']:.1f} |")
  results = {"workdir": args.workdir, "split": split, "mode": args.mode, "sentences": n,
             "warmup": "one untimed decode of each variant before the timed runs",
             "rows": rows}
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=2)
  return results


if __name__ == "__main__":
  main()

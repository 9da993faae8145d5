"""How a checkpoint read fails: reported by every process, agreed on, explained.

Each process of a job reads only its own shards, so a damaged file can fail one
process's read alone, and Orbax's restore ends at a barrier of all processes
that a process which raised would never reach. So a failed read returns a
ReadFailure (`handlers`); the processes then share what each met
(`agreed_failure`), and a step that any of them could not read is unreadable
for all. A stored shape or tree of arrays other than the model's is no damage
but a changed vocabulary or config (`raise_if_mismatched`). The Checkpointer
(checkpoints.py) acts on the outcome: it tries an older step or sets one aside.
"""

import re

import jax
import orbax.checkpoint as ocp

from transformer import distributed, event_loops, runtime


class UnreadableCheckpointError(runtime.CommandError):
  """The checkpoint asked for, or every checkpoint there is, cannot be read."""


class MismatchedCheckpointError(runtime.CommandError):
  """A checkpoint's arrays have other shapes than the model built to restore it,
  or are other arrays: the vocabulary or the model's config changed, not the files."""


# Orbax's message where a stored array's shape is not the one asked for.
_SHAPE_MISMATCH = re.compile(r"Requested shape: (\([0-9, ]*\)) is not compatible with the "
                             r"stored shape: (\([0-9, ]*\))")


# Orbax's message where the model's tree of arrays is not the stored one; each
# difference follows on a line of its own, "<path>:", then which side lacks it.
_TREE_MISMATCH = "tree structures do not match"
_TREE_PATH = re.compile(r"^(\S.*):\n\s+- Source: (MISSING)?.*\n\s+- Target: (MISSING)?",
                        re.MULTILINE)


def _tree_differences(text: str) -> str:
  """The first paths of Orbax's tree mismatch in `text`, the model's parameters
  first (not their optimizer moments), each with the side that lacks it."""
  found = []
  for path, no_model, no_checkpoint in _TREE_PATH.findall(text):
    name = re.sub(r"[.\[\]]+", "/", path).strip("/")
    side = ("only in the model" if no_checkpoint else "only in the checkpoint" if no_model
            else "other arrays")
    found.append(f"{name} ({side})")
  found.sort(key=lambda n: not n.startswith("params/"))
  return ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")


def raise_if_mismatched(messages, candidate: int, directory: str, target) -> None:
  """MismatchedCheckpointError where any process's message (`messages`, the same
  list in every process, so that all raise alike) is Orbax's tree mismatch,
  naming the arrays only one side has, or its shape mismatch, naming the model's
  arrays of the shape asked for. Not an unreadable checkpoint: every older one
  has the same arrays, and none is set aside."""
  misfit = f"checkpoint {candidate} in {directory} does not fit the model built to restore it"
  tree = next((m for m in messages if _TREE_MISMATCH in m), None)
  if tree:
    paths = tree.partition(_TREE_MISMATCH)[2].lstrip(": ")
    raise MismatchedCheckpointError(
        f"{misfit}: its arrays are not the model's{': ' if paths else ''}{paths}. "
        "config.model changed since it was saved (its layers, say): put back the "
        "config.json it was trained with (nothing was changed there)")
  found = next(filter(None, map(_SHAPE_MISMATCH.search, messages)), None)
  if not found or found.group(1) == "()":  # A scalar asked for: no vocabulary's doing.
    return
  wanted, stored = found.groups()
  names = [jax.tree_util.keystr(path, simple=True, separator="/")
           for path, leaf in jax.tree_util.tree_leaves_with_path(target)
           if str(tuple(leaf.shape)) == wanted]
  names = [n for n in names if n.startswith("params/")] or names  # Not their optimizer moments.
  raise MismatchedCheckpointError(
      f"{misfit}: it stores {stored} where the model has {wanted}"
      + (f" ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})" if names else "")
      + ". The vocabulary (its size sets the embeddings' rows) or config.model changed "
      "since it was saved: put back the vocabulary and config.json it was trained with "
      "(nothing was changed there)")


def first_line(error: Exception) -> str:
  """`Type: first line` of an error (runtime.first_line)."""
  return f"{type(error).__name__}: {runtime.first_line(error)}"


def reason(error: Exception) -> str:
  """Why a read failed, in one line: the innermost error of the chain that has
  a message. Orbax wraps TensorStore's error, which names the array's chunk, the
  file and what is wrong (`Error reading "params.w/0.0" in OCDBT database at ...:
  Requested byte range [0, 7610) is not valid for value of size 1000`), in one
  that gives only the chunk's index and the repr of a bound method. Without the
  spec that TensorStore may append (its whole JSON), and up to 400 characters:
  the file's path is in it."""
  while error.__cause__ is not None and str(error.__cause__).strip():
    error = error.__cause__
  line = (str(error).strip().splitlines() or [""])[0]
  if _TREE_MISMATCH in line:  # Its differences follow on lines of their own.
    line = ": ".join(filter(None, [line.rstrip(":"), _tree_differences(str(error))]))
  line = re.sub(r" \[(tensorstore_spec|source locations)\b.*", "", line)
  return f"{type(error).__name__}: {line[:400]}"


class ReadFailure:
  """What a process's read of a checkpoint item returned instead of raising."""

  def __init__(self, error: Exception):
    self.error = error


def reporting(handler_cls):
  """`handler_cls`, but a failed read returns a ReadFailure instead of raising:
  Orbax's restore ends at a barrier of all processes, which a process that
  raised would never reach. Checkpoints record `handler_cls` as their handler.
  Its reads end before it returns, failed or not (event_loops.FinishingLoop)."""

  class Reporting(handler_cls):

    @classmethod
    def typestr(cls) -> str:
      return handler_cls.typestr()

    def restore(self, directory, args=None):
      try:
        with event_loops.finishing_event_loops():
          return super().restore(directory, args=args)
      except Exception as e:  # pylint: disable=broad-except
        return ReadFailure(e)

  return Reporting


def handlers():
  """Orbax's handler registry for a checkpoint's items: the standard handler for
  the state, JSON for the data position and the checksums, each `reporting`."""
  registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
  for item, handler_cls, save, restore in (
      ("state", ocp.StandardCheckpointHandler, ocp.args.StandardSave, ocp.args.StandardRestore),
      ("data", ocp.JsonCheckpointHandler, ocp.args.JsonSave, ocp.args.JsonRestore),
      ("checksums", ocp.JsonCheckpointHandler, ocp.args.JsonSave, ocp.args.JsonRestore)):
    handler = reporting(handler_cls)()
    registry.add(item, save, handler)
    registry.add(item, restore, handler)
  return registry


def agreed_failure(error):
  """(why a checkpoint read failed: this process's error, else the first other
  process's (named), else None; every process's message, "" where it read its
  part): a failure in any process is a failure in all."""
  mine = "" if error is None else reason(error)
  messages = distributed.gather_messages(mine)
  if mine:
    return mine, messages
  for process, message in enumerate(messages):
    if message:
      return f"process {process} could not read its part: {message}", messages
  return None, messages

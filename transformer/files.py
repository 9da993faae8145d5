"""Writing a file so that a crash never leaves half of it: a temporary file in
the same directory, renamed over the target only once it is complete."""

import contextlib
import os


@contextlib.contextmanager
def atomic_path(path):
  """Yields a temporary path to write; renames it to `path` if the block ends
  normally, removes it if not."""
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    yield tmp
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_atomic(path, data) -> None:
  """Writes `data` (str as UTF-8, or bytes) to `path` atomically."""
  with atomic_path(path) as tmp:
    if isinstance(data, bytes):
      with open(tmp, "wb") as f:
        f.write(data)
    else:
      with open(tmp, "w", encoding="utf-8") as f:
        f.write(data)

"""Process set-up shared by the commands: an allocator that keeps the memory it
frees, JAX's persistent compilation cache, a training log without the
libraries' INFO chatter, and bad input reported in one line.

The commands RESTART THEMSELVES once at start-up (os.execve, same arguments) to
change the allocator, and say so in one line on stderr; a debugger attached to
the first process loses it. TRANSFORMER_DEFAULT_MALLOC=1 turns this off.

Compiled programs are cached on disk (jax_compilation_cache_dir), so a resumed
training, `evaluate` and `translate` skip most compilation on a rerun: the
directory is $TRANSFORMER_COMPILATION_CACHE, default ~/.cache/transformer/jax;
TRANSFORMER_COMPILATION_CACHE=0 turns it off.

On a CPU, XLA allocates and frees large buffers every step. glibc's malloc hands
the big ones back to the kernel at once, and the next step faults them in again;
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (transparent huge pages) removes most of
those faults. In a virtual machine that reports free memory to its host, memory
handed back is also unmapped there, and re-touching it costs far more than a
page fault; tcmalloc told never to release memory (TCMALLOC_RELEASE_RATE=0)
avoids both (figures: benchmarks/README.md, 'Measurements behind the code').
So the commands re-execute themselves once with the glibc tunable set and,
where gperftools' tcmalloc is installed (Debian/Ubuntu: libtcmalloc-minimal4),
with it preloaded and set so.
These variables act only at process start, hence the re-execution. Opt out with
TRANSFORMER_DEFAULT_MALLOC=1; TRANSFORMER_TCMALLOC=0 keeps glibc's malloc (with
the tunable), TRANSFORMER_TCMALLOC=/path/libtcmalloc.so picks a library.

TensorFlow, loaded late by TFDS (reading data) and by clu and TensorBoard
(writing and reading events), prints notes on stderr as its libraries load:
"oneDNN custom operations are on", once per library with its own copy of absl's
C++ logging (libtensorflow_framework.so.2, then the profiler's
_pywrap_profiler_plugin.so), each after absl's "WARNING: All log messages before
absl::InitializeLog() is called are written to STDERR"; and cpu_feature_guard's
list of CPU instructions. Importing this module (every command does, before
TensorFlow loads) sets TF_CPP_MIN_LOG_LEVEL=1 (TensorFlow's own INFO lines off,
its warnings and errors kept; JAX sets the same when imported) and
TF_ENABLE_ONEDNN_OPTS=0: the oneDNN note goes through absl at load time, where
no log level reaches it, and is printed only while TensorFlow's oneDNN kernels
are on. TensorFlow here only reads and writes files and computes nothing of the
model (JAX, which reads no TF_ENABLE_ONEDNN_OPTS, does). A value already set in
the environment is kept.
"""

import contextlib
import ctypes.util
import importlib.util
import inspect
import logging
import os
import signal
import sys
import threading

from transformer import streams

TUNABLE = "glibc.malloc.hugetlb=1"
TCMALLOC_NAMES = ("tcmalloc_minimal", "tcmalloc")
TCMALLOC_ENV = {  # Never hand memory back; no "large alloc" report on stderr.
    "TCMALLOC_RELEASE_RATE": "0",
    "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(1 << 40),
}
NOISY_LIBRARIES = ("/orbax/", "/tensorflow_datasets/")
RESTARTED_ENV = "TRANSFORMER_RESTARTED_WITH"  # Set in the re-executed process.
CACHE_ENV = "TRANSFORMER_COMPILATION_CACHE"
DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "transformer", "jax")
QUIET_TENSORFLOW_ENV = {"TF_CPP_MIN_LOG_LEVEL": "1", "TF_ENABLE_ONEDNN_OPTS": "0"}


def quiet_tensorflow(environ=os.environ) -> None:
  """Sets QUIET_TENSORFLOW_ENV in `environ` where not already set (see above):
  done when this module is imported, so before TensorFlow loads."""
  for name, value in QUIET_TENSORFLOW_ENV.items():
    environ.setdefault(name, value)


quiet_tensorflow()


def find_tcmalloc():
  """The tcmalloc library to preload, or None: $TRANSFORMER_TCMALLOC, else the
  system's (by ldconfig), else None."""
  chosen = os.environ.get("TRANSFORMER_TCMALLOC")
  if chosen == "0":
    return None
  if chosen:
    if not os.path.exists(chosen):
      raise FileNotFoundError(f"TRANSFORMER_TCMALLOC={chosen!r}: no such file (set it "
                              "to a libtcmalloc .so, or to 0 for glibc's malloc).")
    return chosen
  for name in TCMALLOC_NAMES:
    found = ctypes.util.find_library(name)
    if found:
      return found
  return None


def fast_malloc_env(environ):
  """`environ` with the allocator settings above added (kept where already set)."""
  current = environ.get("GLIBC_TUNABLES", "")
  env = dict(environ, GLIBC_TUNABLES=":".join(filter(None, [current, TUNABLE])))
  tcmalloc = find_tcmalloc()
  if tcmalloc:
    env["LD_PRELOAD"] = ":".join(filter(None, [tcmalloc, environ.get("LD_PRELOAD")]))
    env.update({k: environ.get(k, v) for k, v in TCMALLOC_ENV.items()})
  return env


# Where JAX finds a GPU: its CUDA plugin (the package's name, then the module
# JAX loads), and the NVIDIA driver's control device; a TPU: libtpu and its device.
GPU_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_plugins.xla_cuda12",
               "jax_plugins.xla_cuda13")


def accelerator_expected(environ=os.environ, exists=os.path.exists,
                         find_spec=importlib.util.find_spec) -> bool:
  """Whether JAX will compute on a GPU or TPU, judged before it starts:
  JAX_PLATFORMS's first platform where it is set, else an installed plugin
  beside its device."""
  platforms = [p.strip() for p in environ.get("JAX_PLATFORMS", "").split(",") if p.strip()]
  if platforms:
    return platforms[0] != "cpu"

  def installed(name):
    try:
      return find_spec(name) is not None
    except (ImportError, ValueError):  # A parent package that is not there.
      return False
  return ((exists("/dev/nvidiactl") and any(installed(m) for m in GPU_PLUGINS))
          or (installed("libtpu") and (exists("/dev/accel0") or exists("/dev/vfio/0"))))


def use_fast_malloc() -> None:
  """Re-executes this command with fast_malloc_env (Linux only, at most once),
  unless JAX will compute on a GPU or TPU: the allocator is for XLA's CPU
  programs' buffers, and elsewhere the restart would only cost its time."""
  restarted = os.environ.get(RESTARTED_ENV)
  if restarted:
    if sys.stderr is None:  # Started with descriptor 2 closed (`2>&-`).
      return
    sys.stderr.write(f"[transformer] restarted once with {restarted} (a faster allocator "
                     "for XLA on a CPU; TRANSFORMER_DEFAULT_MALLOC=1 turns this off)\n")
    return
  current = os.environ.get("GLIBC_TUNABLES", "")
  if (not sys.platform.startswith("linux") or "glibc.malloc.hugetlb" in current
      or os.environ.get("TRANSFORMER_DEFAULT_MALLOC") or accelerator_expected()):
    return
  try:
    env = fast_malloc_env(os.environ)
  except FileNotFoundError as e:  # A bad TRANSFORMER_TCMALLOC: the message, no traceback.
    sys.exit(f"error: {e}")
  env[RESTARTED_ENV] = " ".join(
      filter(None, [f"LD_PRELOAD={env['LD_PRELOAD']}" if "LD_PRELOAD" in env else "",
                    f"GLIBC_TUNABLES={env['GLIBC_TUNABLES']}"]))
  for stream in (sys.stdout, sys.stderr):
    if stream is not None:  # None: started with its descriptor closed (`>&-`).
      stream.flush()
  os.execve(sys.executable, sys.orig_argv, env)


def use_compilation_cache():
  """Turns on JAX's persistent compilation cache (see above); returns its
  directory, or None when TRANSFORMER_COMPILATION_CACHE=0."""
  import jax  # pylint: disable=g-import-not-at-top
  chosen = os.environ.get(CACHE_ENV, "")
  if chosen == "0":
    return None
  path = os.path.abspath(os.path.expanduser(chosen or DEFAULT_CACHE_DIR))
  jax.config.update("jax_compilation_cache_dir", path)
  # Programs that compile in under 0.2 s are not worth a disk entry. JAX's default,
  # 1 s, left out the teacher-forced loss's programs (0.2-1 s a batch shape), which
  # every `evaluate` then compiled again: ~2 s of a 13 s run on Multi30k.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
  _remove_failed_cache_writes()
  return path


def _remove_failed_cache_writes() -> None:
  """JAX's cache writes an entry in place and never replaces one that exists
  (jax._src.lru_cache.LRUCache.put), so an entry cut off by a full disk or a
  file size limit would stay: every later run would warn that it cannot read it
  and compile again. Here a write that fails removes what it wrote. (A kill in
  the milliseconds of a write can still leave one: delete the cache directory.)
  Where JAX's cache is not what this expects, it is left as it is."""
  try:
    from jax._src import lru_cache  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  put = getattr(lru_cache.LRUCache, "put", None)
  suffix = getattr(lru_cache, "_CACHE_SUFFIX", None)
  if put is None or not isinstance(suffix, str) or getattr(put, "removes_failed_writes", False):
    return

  def put_or_remove(cache, key, value):
    try:
      put(cache, key, value)
    except BaseException:
      with contextlib.suppress(Exception):
        (cache.path / f"{key}{suffix}").unlink()
      raise

  put_or_remove.removes_failed_writes = True
  lru_cache.LRUCache.put = put_or_remove


# Orbax warns whenever a checkpoint directory is opened read-only, which
# evaluate, translate and average_checkpoints do on purpose (workdir.restore).
EXPECTED_LIBRARY_WARNINGS = ("Given directory is read only",)


def _not_library_info(record: logging.LogRecord) -> bool:
  if not any(name in record.pathname for name in NOISY_LIBRARIES):
    return True
  # Python's levels: absl.logging.WARNING is absl's own scale (-1), not 30.
  return (record.levelno >= logging.WARNING
          and not str(record.msg).startswith(EXPECTED_LIBRARY_WARNINGS))


def quiet_library_logs() -> None:
  """Drops Orbax's and TFDS's INFO records (a dozen lines per checkpoint) and
  the warnings we expect (EXPECTED_LIBRARY_WARNINGS) from absl's log, and JAX's
  INFO lines on the backends it tried ("Unable to initialize backend 'tpu'" on
  every machine without one); their warnings and errors still pass."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl_logger = absl_logging.get_absl_logger()
  if _not_library_info not in absl_logger.filters:
    absl_logger.addFilter(_not_library_info)
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)


def first_line(error: Exception, limit: int = 200) -> str:
  """The first line of an error's message (at most `limit` characters): enough for
  a one-line report, where Orbax's, JAX's and SentencePiece's run to many lines."""
  return (str(error).strip().splitlines() or [""])[0][:limit]


class CommandError(Exception):
  """A problem the user fixes (a busy workdir, a config the workdir was not
  trained with, a checkpoint the disk refused), not a bug: reported in one line."""


# What a command reports as one line: bad values and paths (ValueError, OSError:
# a missing file, a full disk, a denied permission) and CommandError.
ONE_LINE_ERRORS = (OSError, ValueError, CommandError)


_interrupted = []  # A SIGINT came (catch_interrupts), whether or not its exception ended anything.


def _interrupt(signum, frame):
  del signum, frame
  _interrupted.append(True)
  raise KeyboardInterrupt


def catch_interrupts() -> None:
  """SIGINT raises KeyboardInterrupt, as Python's own handler does, and is
  remembered: raised inside a callback that swallows exceptions (JAX's garbage
  collection callback prints `Exception ignored ... KeyboardInterrupt` and goes
  on), a Ctrl-C at start-up was lost, and training went on to its last step.
  raise_lost_interrupt() raises it again. Only where Python's handler or
  end_at_interrupt's is set (the main thread; training's own stop handler
  replaces this one meanwhile)."""
  if (threading.current_thread() is threading.main_thread()
      and (signal.getsignal(signal.SIGINT) is signal.default_int_handler
           or getattr(signal.getsignal(signal.SIGINT), "start_up", False))):
    signal.signal(signal.SIGINT, _interrupt)


def end_at_interrupt(command: str) -> None:
  """Until one_line_errors takes over (catch_interrupts): a Ctrl-C ends `command`
  at once, with `{command}: interrupted`, as one_line_errors ends it. Set first
  in a command's __main__, before use_fast_malloc's restart (a Ctrl-C just
  before it was lost) and the imports (a KeyboardInterrupt in one was a
  traceback, or an extension's ImportError): nothing is written yet. Only where
  Python's handler is set: a SIGINT the command was started ignoring (`cmd &`
  in a script) stays ignored."""
  if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
    return

  def handler(signum, frame):
    del signum, frame
    _end_interrupted(command)
  handler.start_up = True
  signal.signal(signal.SIGINT, handler)


def _end_interrupted(command: str) -> None:
  """`{command}: interrupted` on stderr, then the end by SIGINT, as Python's own
  handling ends a process: a shell reports status 130, and a shell script or
  loop running the command stops too."""
  sys.stderr.write(f"{command}: interrupted\n")
  sys.stderr.flush()
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  os.kill(os.getpid(), signal.SIGINT)
  sys.exit(130)  # Where the signal does not end the process.


def raise_lost_interrupt() -> None:
  """KeyboardInterrupt where a SIGINT came and this code still runs: its
  exception was swallowed where it was raised (catch_interrupts)."""
  if _interrupted:
    raise KeyboardInterrupt


@contextlib.contextmanager
def one_line_errors(command: str, extra=()):
  """Turns ONE_LINE_ERRORS (and `extra`) raised in the block into
  `{command}: error: {message}` on stderr and exit status 1: the message names
  the problem, and a traceback would only bury it. The traceback still goes to
  absl's log at DEBUG level (`--verbosity=1` shows it). A Ctrl-C that reaches
  the block (start-up, evaluate, translate: training's steps take theirs as a
  stop request) is `{command}: interrupted`, also where its exception was
  swallowed (raise_lost_interrupt at the block's end), and the process then ends by
  SIGINT, as Python's own handling ends it: a shell reports status 130, and a
  shell script or loop running the command stops too. A write to a stdout whose
  reader has gone (`translate | head`) ends the process by SIGPIPE, silently,
  as a C filter ends; stdout is flushed at the block's end, so that a write
  that fails there (a full disk) is one line too. What the command wrote is
  kept as it left it."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  catch_interrupts()
  try:
    yield
    raise_lost_interrupt()  # Swallowed where it was raised: the command still ends by it.
    streams.flush_stdout()  # Its last lines' failure is the command's too.
  except ONE_LINE_ERRORS + tuple(extra) as e:
    absl_logging.debug("%s stopped on", command, exc_info=True)
    if isinstance(e, BrokenPipeError) and streams.reader_gone():
      streams.end_reader_gone()
    streams.drop_what_stdout_cannot_write()
    sys.exit(f"{command}: error: {e}")
  except (MemoryError, RuntimeError) as e:  # A size too large, say: the error names it.
    if not isinstance(e, MemoryError) and not _out_of_device_memory(e):
      raise
    absl_logging.debug("%s stopped on", command, exc_info=True)
    sys.exit(f"{command}: error: out of memory: {first_line(e) if str(e) else 'MemoryError'}")
  except KeyboardInterrupt:
    absl_logging.debug("%s interrupted", command, exc_info=True)
    _end_interrupted(command)


def _out_of_device_memory(error: BaseException) -> bool:
  """Whether `error` is XLA's failed allocation (JAX's JaxRuntimeError, a
  RuntimeError: this module imports no JAX)."""
  return (type(error).__name__ in ("JaxRuntimeError", "XlaRuntimeError")
          and str(error).startswith("RESOURCE_EXHAUSTED"))


def parse_flags(argv, command: str, config_flag: str = "config", flag_values=None):
  """absl's flag parsing (app.run's flags_parser), with a bad flag or a bad
  config flag (a file that does not load, a mistake inside the file, a file
  that builds no config, an override of a field the config lacks, a value of
  the wrong type) stopping `command` in one line naming it, instead of absl's
  usage note or a traceback from ml_collections."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  from transformer import config as config_lib  # pylint: disable=g-import-not-at-top
  flag_values = flags.FLAGS if flag_values is None else flag_values
  try:
    rest = flag_values(argv)
    config = flag_values[config_flag].value if config_flag in flag_values else None
    if config is not None:
      where = f"--{config_flag} {flag_values[config_flag].config_filename}"
      if not isinstance(config, ml_collections.ConfigDict):
        getattr(config, "get", None)  # ml_collections' stand-in for a file that failed to load raises.
        raise ValueError(f"{where}: get_config() returned an object of type "
                         f"{type(config).__name__!r}, not an ml_collections.ConfigDict")
      config_lib.check_sections(config, where)
  except Exception as e:  # pylint: disable=broad-except
    frame = _frame_outside_libraries(e)
    if frame is not None:  # A mistake in the config file's own code.
      sys.exit(f"{command}: error: {frame.filename}:{frame.lineno}: {type(e).__name__}: "
               f"{' '.join(_message(e).split())}")
    if isinstance(e, SyntaxError):  # The file does not compile: its place is in the error.
      where = e.filename or f"--{config_flag} {_given(argv, config_flag)}"
      line = f":{e.lineno}" if e.filename and e.lineno else ""
      sys.exit(f"{command}: error: {where}{line}: {type(e).__name__}: {e.msg}")
    if isinstance(e, AttributeError) and e.name == "get_config" and inspect.ismodule(e.obj):
      sys.exit(f"{command}: error: --{config_flag} {_given(argv, config_flag)}: the file "
               "defines no get_config()")
    if isinstance(e, (AttributeError, KeyError)):
      # ml_collections: a field the config lacks, as "'name'\nDid you mean ...?".
      name, *hint = _message(e).splitlines() or [""]
      name = name.strip("\"'")
      given = [a.split("=")[0] for a in argv[1:] if a.startswith(f"--{config_flag}.")
               and name in a.split("=")[0].split(".")]
      hint = f" ({' '.join(hint).strip()})" if hint else ""
      sys.exit(f"{command}: error: {given[0] if given else name}: no such field in the "
               f"config{hint}")
    if not isinstance(e, (flags.Error, OSError, ValueError, TypeError)):
      raise
    # ml_collections' messages run over lines (a file's traceback, the paths
    # tried): the first says what failed, the last why.
    lines = [l.strip() for l in str(e).splitlines() if l.strip()] or [type(e).__name__]
    message = lines[0] if len(lines) == 1 else f"{lines[0].rstrip(':')}: {lines[-1]}"
    sys.exit(f"{command}: error: {message}")
  return rest


def _given(argv, flag: str):
  """The value argv gives flag `flag` (`--flag=VALUE` or `--flag VALUE`)."""
  for i, arg in enumerate(argv):
    if arg.startswith(f"--{flag}="):
      return arg.split("=", 1)[1]
    if arg == f"--{flag}" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def run(main, command: str) -> None:
  """absl's app.run(main) with parse_flags: every command's bad flag is one line
  (absl's own parser adds a usage hint on a second), and so is main's
  app.UsageError (a stray argument), where absl prints the whole usage."""
  from absl import app  # pylint: disable=g-import-not-at-top
  streams.set_up()

  def one_line_usage(argv):
    try:
      return main(argv)
    except app.UsageError as e:
      sys.exit(f"{command}: error: {e}")

  app.run(one_line_usage, flags_parser=lambda argv: parse_flags(argv, command))


def _message(error) -> str:
  """An exception's own text: ml_collections raises AttributeError(KeyError(text)),
  whose str() is the KeyError's repr, quotes and escaped newlines included."""
  while isinstance(error, BaseException) and len(error.args) == 1:
    error = error.args[0]
  return str(error)


def _frame_outside_libraries(error):
  """The innermost traceback frame of `error` in code of neither Python's, the
  installed packages' nor this package's (a config file's, say), or None."""
  import traceback  # pylint: disable=g-import-not-at-top
  ours = (os.path.dirname(os.__file__), os.path.dirname(os.path.abspath(__file__)))
  frames = [f for f in traceback.extract_tb(error.__traceback__)
            if not f.filename.startswith("<") and "-packages" not in f.filename
            and not os.path.abspath(f.filename).startswith(ours)]
  return frames[-1] if frames else None

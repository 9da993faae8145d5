"""Device machine only: its image lacks TensorFlow (and the 64 MiB tree cannot carry
it), which clu's TensorBoard writer imports. This stands in for that writer; the
log writer keeps every metric."""
import sys
import types


class SummaryWriter:
  def __init__(self, logdir):
    del logdir

  def _drop(self, *args, **kwargs):
    del args, kwargs

  write_summaries = write_scalars = write_images = write_videos = _drop
  write_audios = write_texts = write_histograms = write_hparams = flush = close = _drop


_module = types.ModuleType("clu.metric_writers.tf.summary_writer")
_module.SummaryWriter = SummaryWriter
sys.modules[_module.__name__] = _module

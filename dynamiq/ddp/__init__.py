"""dynamiq in a training loop: a DDP communication hook.

.. code-block:: python

   from dynamiq.ddp import DynamiQState, dynamiq_hook

   model = torch.nn.parallel.DistributedDataParallel(model)
   state = DynamiQState(pipeline="dynamiq", start_iter=1)
   model.register_comm_hook(state, dynamiq_hook)

See :mod:`dynamiq.ddp.hook` for what the hook does with each bucket and
:class:`DynamiQState` for the settings, the statistics and checkpointing.
"""

from dynamiq.ddp.hook import dynamiq_hook
from dynamiq.ddp.state import DEFAULT_MIN_COMPRESS_NUMEL, DynamiQState, HookStats

__all__ = ["DEFAULT_MIN_COMPRESS_NUMEL", "DynamiQState", "HookStats", "dynamiq_hook"]

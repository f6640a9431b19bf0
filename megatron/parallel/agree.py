"""Decisions every rank must take alike (which checkpoint to resume, whether run.dir is usable):
rank 0 decides, every rank receives the result or the same error."""
from __future__ import annotations

from typing import Callable, TypeVar

import torch.distributed as dist

from megatron.config.errors import ConfigError, InputError

T = TypeVar("T")


def rank0_decides(work: Callable[[], T]) -> T:
    """Runs `work` on rank 0 only and hands its result, or its InputError/ConfigError, to every
    rank, so all ranks go on together or fail with the same message."""
    box = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", work())
        except (InputError, ConfigError) as e:
            box[0] = ("error", str(e))  # the message travels: ConfigError does not unpickle
    dist.broadcast_object_list(box, src=0)
    status, value = box[0]
    if status == "error":
        raise InputError(value)
    return value

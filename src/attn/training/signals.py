"""Stopping a run cleanly: SIGINT and SIGTERM end training after the current update, on every rank.

While `recording_stop_signals` is active the signals are only recorded; the trainer asks `agreed_stop_signal`
after each update, saves a checkpoint of that step and raises `TrainingInterrupted` (`attn train` exits 130 or 143).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from attn.training.distributed import DistContext, all_reduce_sum

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped `train` after an update, and a checkpoint of that step was saved.

    A KeyboardInterrupt, so a caller that does not handle it stops as on Ctrl-C; running the same `train` again
    resumes from the checkpoint. `checkpoint` (the checkpoint of `step`) is None on ranks other than 0.
    """

    def __init__(self, signal_number: int, step: int, checkpoint: Path | None) -> None:
        self.signal_number, self.step, self.checkpoint = signal_number, step, checkpoint
        where = checkpoint if checkpoint is not None else "the run directory by rank 0"
        super().__init__(f"interrupted at step {step}; checkpoint saved to {where}")

    @property
    def exit_code(self) -> int:
        """The status of a process that the signal ended: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signal_number


@contextlib.contextmanager
def recording_stop_signals() -> Iterator[list[int]]:
    """While active, SIGINT and SIGTERM are appended to the yielded list instead of stopping the process.

    The previous handlers come back on exit. Further signals are recorded too rather than aborting the final
    checkpoint: under torchrun every rank gets the terminal's Ctrl-C and then the launcher's own copy of it. Only
    the main thread can catch signals; elsewhere nothing is installed and the list stays empty.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    for number in STOP_SIGNALS:
        signal.signal(number, lambda signum, frame: received.append(signum))
    try:
        yield received
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def agreed_stop_signal(received: Sequence[int], ctx: DistContext) -> int:
    """The signal all ranks stop for: SIGINT if any rank received one, else SIGTERM if any did, else 0.

    `received` is this rank's list from `recording_stop_signals`. A collective (one all-reduce), so every rank
    leaves the training loop after the same update.
    """
    got = torch.tensor([signal.SIGINT in received, signal.SIGTERM in received], device=ctx.device)
    interrupt, terminate = all_reduce_sum(got.float(), ctx).tolist()
    return signal.SIGINT if interrupt else signal.SIGTERM if terminate else 0

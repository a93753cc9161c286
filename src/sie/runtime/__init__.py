"""How a role's process runs: its event loop, the signals that stop it, garbage collection after start-up,
default thread counts, child supervision (`children`) and periodic background tasks (`periodic`). Policy only;
the roles and components decide what runs on it."""

from sie.runtime.process import (
    default_intra_op_threads,
    event_loop_factory,
    freeze_startup_heap,
    run_event_loop,
    wait_for_signal,
)

__all__ = [
    "default_intra_op_threads",
    "event_loop_factory",
    "freeze_startup_heap",
    "run_event_loop",
    "wait_for_signal",
]

"""StopFlag's decisions (training/signals.py): which signals ask for a checkpoint and a stop, a
second Ctrl-C stops at once while the same Ctrl-C delivered twice (the terminal and torchrun's
agent both signal the workers) does not, and the handlers before a run are put back after it."""
import signal

import pytest

from megatron.training import signals
from megatron.training.signals import STOP_SIGNALS, StopFlag


def test_every_stop_signal_raises_the_flag_and_the_old_handlers_come_back():
    def mine(signum, frame):
        pass
    before = {sig: signal.signal(sig, mine) for sig in STOP_SIGNALS}
    try:
        with StopFlag() as flag:
            for sig in STOP_SIGNALS:
                assert signal.getsignal(sig) == flag._handler
        for sig in STOP_SIGNALS:
            assert signal.getsignal(sig) is mine
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert {signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGQUIT,
            signal.SIGINT} == set(STOP_SIGNALS)


def test_a_second_ctrl_c_stops_now_but_a_repeated_delivery_does_not(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(signals.time, "monotonic", lambda: clock[0])
    flag = StopFlag()
    flag._handler(signal.SIGINT, None)
    assert flag.raised
    clock[0] += signals.REPEAT_S / 2
    flag._handler(signal.SIGINT, None)  # the same Ctrl-C, forwarded by torchrun's agent
    clock[0] += signals.REPEAT_S
    with pytest.raises(KeyboardInterrupt):
        flag._handler(signal.SIGINT, None)


def test_other_signals_never_stop_at_once():
    flag = StopFlag()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGHUP, signal.SIGQUIT):
        flag._handler(sig, None)
    assert flag.raised

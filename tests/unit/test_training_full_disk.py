"""metrics.jsonl on a full disk: the write that fails is one InputError naming the file, 'no space
left on device' and the bytes of the line, and the part of the line that reached the disk is cut
off, so the file stays whole lines that read back. Simulated ENOSPC; the real full disk (a tmpfs)
is tests/integration/test_training_full_disk_tmpfs.py."""
import errno
import io
import os

import pytest

from megatron.base.records import read_metrics
from megatron.base.rundir import RunDir
from megatron.config.errors import InputError
from megatron.training.metrics import MetricsWriter
from tests.support.metrics import step_record




class FullRaw(io.FileIO):
    room = 0

    def write(self, b):
        b = bytes(b)
        left = self.room - os.fstat(self.fileno()).st_size
        if len(b) > left:
            super().write(b[:max(left, 0)])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(b)


def test_a_metrics_line_on_a_full_disk_is_one_message_and_no_partial_line(tmp_path):
    w = MetricsWriter(RunDir(str(tmp_path)), tensorboard=False)
    w.write(step_record(1))
    w.file.close()
    raw = FullRaw(w.path, "a")
    FullRaw.room = os.path.getsize(w.path) + 20  # 20 bytes of the next line fit
    w.file = io.TextIOWrapper(io.BufferedWriter(raw), line_buffering=True)
    with pytest.raises(InputError) as e:
        w.write(step_record(2))
    msg = str(e.value)
    assert msg.startswith(w.path + ": no space left on device while writing a metrics line"), msg
    assert "(needs " in msg and "bytes free" in msg and "\n" not in msg, msg
    w.close()
    assert [r.step for r in read_metrics(w.path)] == [1]
    assert open(w.path).read().endswith("\n")

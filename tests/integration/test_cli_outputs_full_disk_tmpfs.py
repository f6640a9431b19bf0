"""A real full disk under the commands' own outputs (base/outputs.write_whole): megatron-plan's
config and megatron-report's page and panels on a small tmpfs give one line naming the file
and the room left, exit 2, and no truncated file or leftover temporary; what was there before
(a config from an earlier search) is kept whole. In-process calls; the mount is a process,
hence an integration test. Skipped with the reason where mounting is not allowed."""
import os

from megatron.cli import plan, report
from megatron.training.metrics import MetricsWriter
from megatron.base.rundir import RunDir
from tests.support.disks import tmpfs
from tests.support.metrics import step_record

PNG_END = b"IEND\xaeB`\x82"


def test_a_full_disk_under_megatron_plan_out_config_keeps_the_old_file(tmp_path, capsys):
    with tmpfs(tmp_path / "disk", "4k") as mnt:
        old = mnt / "best.yaml"
        old.write_text("# an earlier search's config\n")  # takes the one page there is
        assert plan.main(["search", "--model", "gpt3-125m", "--cluster", "a100",
                          "--out-config", str(old)]) == 2
        out, err = capsys.readouterr()
        assert err.startswith(f"megatron-plan: error: {old}: no space left on device while "
                              "writing the config (") and err.count("\n") == 1, err
        assert os.listdir(mnt) == ["best.yaml"]
        assert old.read_text() == "# an earlier search's config\n"


def test_a_full_disk_under_megatron_report_leaves_only_whole_files(tmp_path, capsys):
    run = RunDir(str(tmp_path / "run"))
    writer = MetricsWriter(run, tensorboard=False)
    for n in range(1, 20):
        writer.write(step_record(n))
    writer.close()
    with tmpfs(tmp_path / "disk", "48k") as mnt:
        assert report.main([run.path, "-o", str(mnt / "page")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"megatron-report: error: {mnt / 'page'}/") and \
            "no space left on device while writing a panel of the report" in err, err
        names = os.listdir(mnt / "page")
        assert names and all(n.endswith(".png") and not n.startswith(".") for n in names), names
        for name in names:  # each panel written is whole
            assert (mnt / "page" / name).read_bytes().endswith(PNG_END), name

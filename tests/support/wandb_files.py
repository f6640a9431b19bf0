"""Reads an offline W&B run back: its run-<id>.wandb file is a LevelDB-style log (a 7-byte
header ":W&B", 0xBEE1, version; then 32 KiB blocks of records, each a 7-byte header: CRC32C,
length, type FULL/FIRST/MIDDLE/LAST) of wandb_internal_pb2.Record protobufs. The history
records hold what each wandb.log call logged."""
import glob
import json
import os
import struct
from typing import Dict, List

_BLOCK, _HEADER = 32768, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: str) -> List[bytes]:
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out, pos, partial = [], _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        body = data[pos + _HEADER:pos + _HEADER + length]
        pos += _HEADER + length
        if kind == 0 and length == 0:
            pos += _BLOCK - pos % _BLOCK if pos % _BLOCK else 0
            continue
        if kind == _FULL:
            out.append(body)
        elif kind == _FIRST:
            partial = body
        elif kind == _MIDDLE:
            partial += body
        elif kind == _LAST:
            out.append(partial + body)
    return out


def _parsed(run_dir: str):
    from wandb.proto import wandb_internal_pb2

    files = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    assert len(files) == 1, f"expected one offline run under {run_dir}/wandb, found {files}"
    for raw in records(files[0]):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        yield record


def run_info(run_dir: str) -> Dict[str, object]:
    """The run record: its name, project, group and tags."""
    for record in _parsed(run_dir):
        if record.WhichOneof("record_type") == "run":
            r = record.run
            return {"name": r.display_name, "project": r.project, "group": r.run_group,
                    "tags": list(r.tags)}
    raise AssertionError(f"no run record under {run_dir}/wandb")


def history(run_dir: str) -> List[Dict[str, object]]:
    """Every wandb.log call of the (one) offline run under run_dir/wandb, as {key: value}."""
    out = []
    for record in _parsed(run_dir):
        if record.WhichOneof("record_type") == "history":
            items = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                items[key] = json.loads(item.value_json)
            out.append(items)
    return out

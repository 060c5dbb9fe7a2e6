#!/usr/bin/env python3
"""Writes small valid or deliberately corrupted checkpoints for tests/cli/inspect_errors.sh.

Standard library only. Tensor data is all zero and written sparsely (truncate), so even the full
tiny-V4.1 tensor list (44 MB) costs nothing.

Usage:
  checkpoint_fixture.py plan TENSORS_JSON CONFIG_JSON OUT_DIR [CASE]
      TENSORS_JSON: output of `deepinfer inspect --config-only --json --tensors`;
      writes OUT_DIR/config.json (a copy of CONFIG_JSON) and OUT_DIR/model.safetensors holding
      every expected tensor, then applies CASE:
        valid | missing_tensor | unexpected_tensor | wrong_dtype | wrong_shape | vision_extra
  checkpoint_fixture.py raw CONFIG_JSON OUT_DIR CASE
      writes config.json and a model.safetensors corrupted as CASE:
        truncated | header_past_eof | header_absurd | header_bad_json | unknown_dtype |
        bytes_mismatch | overlap | out_of_range | index_missing_shard | index_bad_json
"""
import json
import os
import shutil
import struct
import sys

SIZES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "U8": 1,
         "I16": 2, "I32": 4, "I64": 8, "BOOL": 1}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype, shape); zero data, contiguous, sorted by name."""
    entries, off = [], 0
    for name, dt, shape in sorted(tensors):
        nb = numel(shape) * SIZES[dt]
        entries.append('"%s":{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}'
                       % (name, dt, ",".join(str(s) for s in shape), off, off + nb))
        off += nb
    header = ('{"__metadata__":{"format":"pt"},' + ",".join(entries) + "}").encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + off)


def write_raw(path, header: bytes, data_len: int, length_field=None):
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header) if length_field is None else length_field) + header)
        f.write(b"\0" * data_len)


def plan_case(tensors_json, config_json, out, case):
    plan = json.load(open(tensors_json))["expected_tensors"]
    tensors = [(t["name"], t["dtype"], list(t["shape"])) for t in plan]
    os.makedirs(out, exist_ok=True)
    shutil.copy(config_json, os.path.join(out, "config.json"))
    by = {n: i for i, (n, _, _) in enumerate(tensors)}
    if case == "missing_tensor":
        tensors.pop(by["layers.5.ffn.gate.bias"])
    elif case == "unexpected_tensor":
        tensors.append(("layers.3.attn.indexer.wq_b.weight", "F8_E4M3", [256, 64]))
    elif case == "wrong_dtype":
        n, _, s = tensors[by["layers.3.attn.wq_b.weight"]]
        tensors[by["layers.3.attn.wq_b.weight"]] = (n, "BF16", s)
    elif case == "wrong_shape":
        n, d, _ = tensors[by["layers.0.ffn.experts.1.w2.weight"]]
        tensors[by["layers.0.ffn.experts.1.w2.weight"]] = (n, d, [64, 64])
    elif case == "vision_extra":
        tensors.append(("vision.norm.weight", "BF16", [1024]))
    elif case != "valid":
        sys.exit("unknown case " + case)
    write_safetensors(os.path.join(out, "model.safetensors"), tensors)


def raw_case(config_json, out, case):
    os.makedirs(out, exist_ok=True)
    shutil.copy(config_json, os.path.join(out, "config.json"))
    st = os.path.join(out, "model.safetensors")
    ok = b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}'
    if case == "truncated":
        open(st, "wb").write(b"\x01\x02\x03\x04\x05")
    elif case == "header_past_eof":
        write_raw(st, ok, 0, length_field=len(ok) + 100)
    elif case == "header_absurd":
        write_raw(st, ok, 16, length_field=(100 << 20) + 1)
    elif case == "header_bad_json":
        write_raw(st, b'{"a":{"dtype":"F32",', 16)
    elif case == "unknown_dtype":
        write_raw(st, b'{"layers.0.x":{"dtype":"Q4_K","shape":[4],"data_offsets":[0,4]}}', 4)
    elif case == "bytes_mismatch":
        write_raw(st, b'{"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,10]}}', 10)
    elif case == "overlap":
        write_raw(st, b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},'
                      b'"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}}', 20)
    elif case == "out_of_range":
        write_raw(st, b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}', 16)
    elif case == "index_missing_shard":
        write_raw(st, ok, 16)
        json.dump({"metadata": {"total_size": 16},
                   "weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}},
                  open(os.path.join(out, "model.safetensors.index.json"), "w"))
    elif case == "index_bad_json":
        write_raw(st, ok, 16)
        open(os.path.join(out, "model.safetensors.index.json"), "w").write('{"weight_map": ')
    else:
        sys.exit("unknown case " + case)


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "plan":
        plan_case(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else "valid")
    elif len(sys.argv) == 5 and sys.argv[1] == "raw":
        raw_case(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)

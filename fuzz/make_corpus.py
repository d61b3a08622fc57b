#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/.

Each corpus holds small valid inputs in the formats the readers document (safetensors laid
out as io/safetensors.h says SafetensorsWriter writes them, token shards as
data/token_shard.h, profiles and plans as `oases profile` and `oases plan` write them, the
repository's configs/*.toml) and a few invalid ones, each broken in one way. The output is
deterministic; re-run after a format change:  python3 fuzz/make_corpus.py
"""
import json
import pathlib
import shutil
import struct
import zlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def write(target, name, data):
    path = CORPUS / target / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


# ---------------------------------------------------------------------------------------
# safetensors

DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U16": 2, "U8": 1}


def safetensors(tensors, metadata=None):
    """tensors: {name: (dtype, shape, raw bytes)}, laid out as SafetensorsWriter does."""
    order = sorted(tensors, key=lambda n: (-DTYPE_SIZE[tensors[n][0]], n))
    header, data, offset = {}, b"", 0
    for name in order:
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        data += raw
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(dict(sorted(header.items())), separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def f32(*values):
    return struct.pack(f"<{len(values)}f", *values)


def make_safetensors():
    small = {
        "wte.weight": ("F32", [4, 2], f32(0.5, -1, 2, 0.25, 3, -0.125, 1e-3, 7)),
        "h.0.ln_1.bias": ("F32", [2], f32(0, 1)),
    }
    write("safetensors", "valid_f32.safetensors",
          safetensors(small, {"format": "pt", "oases_config": "[model]\nlayers = 1\n"}))
    mixed = {
        "f64": ("F64", [2], struct.pack("<2d", 1.5, -2.0)),
        "f16": ("F16", [3], struct.pack("<3H", 0x3C00, 0xFC00, 0x7E00)),   # 1, -inf, nan
        "bf16": ("BF16", [1, 2], struct.pack("<2H", 0x3F80, 0x0001)),      # 1, subnormal
        "i64": ("I64", [1], struct.pack("<q", -5)),
        "i32": ("I32", [2], struct.pack("<2i", 7, -7)),
        "u16": ("U16", [1], struct.pack("<H", 65535)),
        "u8": ("U8", [3], bytes([0, 1, 255])),
        "scalar": ("F32", [], f32(42)),
        "empty": ("F32", [0, 3], b""),
    }
    write("safetensors", "valid_all_dtypes.safetensors", safetensors(mixed))
    write("safetensors", "valid_no_tensors.safetensors", safetensors({}))

    good = safetensors(small)
    write("safetensors", "bad_truncated.safetensors", good[:-5])
    write("safetensors", "bad_header_length.safetensors", struct.pack("<Q", 1 << 40) + good[8:])
    header = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' \
             b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}'
    write("safetensors", "bad_overlap.safetensors",
          struct.pack("<Q", len(header)) + header + bytes(12))
    header = b'{"flag":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}}'
    write("safetensors", "bad_dtype.safetensors", struct.pack("<Q", len(header)) + header + b"\1")
    header = b'{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}'
    write("safetensors", "bad_shape.safetensors", struct.pack("<Q", len(header)) + header + bytes(4))
    header = b'{"__metadata__":{"step":3}}'
    write("safetensors", "bad_metadata.safetensors", struct.pack("<Q", len(header)) + header)
    header = b'{"a":{"dtype":"F32",'
    write("safetensors", "bad_json.safetensors", struct.pack("<Q", len(header)) + header)


# ---------------------------------------------------------------------------------------
# token shards (data/token_shard.h)

def shard(tokens, vocab, width=None, name=b"byte", version=2, count=None, magic=b"OASESTOK",
          crc=None, mask=None, mask_crc=None):
    width = width or (2 if vocab <= 65536 else 4)
    count = len(tokens) if count is None else count
    header = magic + struct.pack("<IIIQ", version, width, vocab, count) + name.ljust(16, b"\0")
    fmt = "<%d%s" % (len(tokens), "H" if width == 2 else "I")
    body = struct.pack(fmt, *tokens)
    if version in (2, 3):
        header += struct.pack("<I", zlib.crc32(body) if crc is None else crc)
    if version == 3:  # the loss mask: a bit per token, least significant first
        bits = bytearray((len(tokens) + 7) // 8)
        for i, counts in enumerate(mask if mask is not None else [1] * len(tokens)):
            bits[i // 8] |= int(counts) << (i % 8)
        header += struct.pack("<I", zlib.crc32(bytes(bits)) if mask_crc is None else mask_crc)
        body += bytes(bits)
    return header + body


def make_token_shards():
    text = b"The quick brown fox.\n"
    write("token_shard", "valid_byte.bin", shard(list(text), 256))
    write("token_shard", "valid_byte_v1.bin", shard(list(text), 256, version=1))
    write("token_shard", "valid_empty.bin", shard([], 256))
    write("token_shard", "valid_width4.bin", shard([0, 1, 65535, 65536, 69999], 70000, name=b"words"))
    write("token_shard", "valid_width4_v1.bin",
          shard([0, 1, 65535, 65536, 69999], 70000, name=b"words", version=1))
    write("token_shard", "valid_long_name.bin", shard([3, 2, 1], 4, name=b"sixteen-chars-xx"))
    write("token_shard", "bad_magic.bin", shard(list(text), 256, magic=b"OASESTOC"))
    write("token_shard", "valid_masked.bin",
          shard(list(text), 256, version=3, mask=[i % 3 != 0 for i in range(len(text))]))
    write("token_shard", "valid_masked_empty.bin", shard([], 256, version=3))
    write("token_shard", "bad_mask_checksum.bin",
          shard(list(text), 256, version=3, mask_crc=12345))
    write("token_shard", "bad_mask_truncated.bin", shard(list(text), 256, version=3)[:-1])
    write("token_shard", "bad_version.bin", shard(list(text), 256, version=4))
    write("token_shard", "bad_checksum.bin", shard(list(text), 256, crc=12345))
    write("token_shard", "bad_vocab_for_tokenizer.bin", shard(list(text), 300))
    write("token_shard", "bad_width.bin", shard([1, 2], 256, width=3))
    write("token_shard", "bad_token.bin", shard([1, 300, 2], 256))
    write("token_shard", "bad_truncated.bin", shard(list(text), 256)[:-1])
    write("token_shard", "bad_trailing.bin", shard(list(text), 256) + b"\0")
    write("token_shard", "bad_trailing_v1.bin", shard(list(text), 256, version=1) + b"\0")
    write("token_shard", "bad_count.bin", shard([1, 2], 256, count=1 << 62))
    write("token_shard", "bad_name.bin", shard([1], 256, name=b"by te"))
    write("token_shard", "bad_short.bin", b"OASESTOK\2\0")


# ---------------------------------------------------------------------------------------
# run configs: the repository's, some with --set overrides (NUL-separated after the text)

def make_run_configs():
    for path in sorted((ROOT / "configs").glob("*.toml")):
        shutil.copyfile(path, CORPUS / "run_config" / path.name)
    demo = (ROOT / "configs" / "demo.toml").read_text()
    overrides = ["parallel.tp=2", "train.lr=1e-3", "model.arch=llama", "model.kv_heads=2",
                 "parallel.plan=1,2,2,1", "data.path=data/x", "checkpoint.resume=true",
                 "checkpoint.dir=runs/x"]
    write("run_config", "demo_with_overrides.toml", demo + "\0" + "\0".join(overrides))
    write("run_config", "minimal_with_overrides.toml",
          "[model]\nlayers = 2\n\0train.steps=3\0log.trace=trace.json\0model.arch=llama\0model.tie_embeddings=false")
    write("run_config", "empty.toml", "")
    write("run_config", "bad_unknown_key.toml", "[model]\nlayer = 4\n")
    write("run_config", "bad_type.toml", "[train]\nlr = \"fast\"\n")
    write("run_config", "bad_heads.toml", "[model]\nhidden = 100\nheads = 3\n")
    write("run_config", "bad_batch.toml", "[train]\nmicro_batch = 3\nglobal_batch = 4\n")
    write("run_config", "bad_toml.toml", "[model\nlayers = = 4\n")
    write("run_config", "bad_override.toml", "[model]\n\0model=4\0train.nope=1")
    write("run_config", "bad_plan.toml", "[parallel]\ntp = 2\nplan = \"1,3\"\n")


# ---------------------------------------------------------------------------------------
# profiles (planner/profile.h, version 3) and plans (planner/planner.h)

def degree_profile(k, tp):
    segments = {kind: {"forward_s": 1e-3 * s / k, "recompute_s": 0.9e-3 * s / k,
                       "backward0_s": 2e-3 * s / k, "backward1_s": 0.3e-3 * s / k}
                 for kind, s in [("embedding", 0.2), ("attention", 1.0), ("mlp", 1.5),
                                 ("head", 2.0), ("head_softmax", 0.1), ("head_loss", 0.1)]}
    collectives = {} if k == 1 else {
        "attention.fwd_s": 1e-4 * k, "attention.bwd_s": 1e-4 * k, "mlp.fwd_s": 1e-4 * k,
        "mlp.bwd_s": 1e-4 * k, "embedding.fwd_s": 5e-5, "head.fwd_s": 5e-5,
        "head_softmax.fwd_s": 2e-6, "head.bwd_s": 5e-5}
    return {"degree": k, "rows": 2 * k // tp or 1, "segments": segments,
            "collectives": collectives, "optimizer_s": 0.004, "parameter_bytes": 8000000 // k,
            "replica_reduce_per_layer_s": 0.0 if k == tp else 0.002,
            "overlap_slowdown": 0.03, "collective_slowdown": 0.45,
            "parameter_bytes_per_layer": 1600000 // k,
            "activation_bytes": {"attention": {"checkpoint": 65536, "internals": 131072 // k,
                                               "core": 32768 // k},
                                 "mlp": {"checkpoint": 65536, "internals": 262144 // k},
                                 "head": {"internals": 16384}},
            "static_activation_bytes": 1 << 20}


def profile(tp=2, version=3):
    return {"format": "oases-profile", "version": version,
            "model": {"arch": "gpt", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 4,
                      "ffn_hidden": 256, "vocab_size": 256, "seq_len": 32},
            "tp": tp, "micro_batch": 4, "sub_batches": 2, "element_bytes": 4,
            "optimizer_state_ratio": 2,
            "degrees": [degree_profile(k, tp) for k in (1, 2, 4) if k <= tp],
            "reshards": {f"{a}-{b}": 2.5e-4 * b for a in (1, 2, 4) for b in (1, 2, 4)
                         if a < b <= tp}}


def make_profiles():
    write("profile", "valid_tp2.json", json.dumps(profile(2), indent=2))
    write("profile", "valid_tp4_compact.json", json.dumps(profile(4), separators=(",", ":")))
    write("profile", "bad_version.json", json.dumps(profile(2, version=2)))
    missing = profile(2)
    del missing["degrees"][1]["collectives"]
    write("profile", "bad_missing_key.json", json.dumps(missing))
    wrong = profile(1)
    wrong["degrees"][0]["rows"] = "two"
    write("profile", "bad_type.json", json.dumps(wrong))
    timed = profile(2)
    timed["activation_codec"] = {
        "bf16": {"encode_s_per_element": 2.1e-10, "decode_s_per_element": 1.7e-10},
        "fp8": {"encode_s_per_element": 1.95e-9, "decode_s_per_element": 3.6e-10}}
    write("profile", "valid_activation_codec.json", json.dumps(timed, indent=2))
    unknown = profile(2)
    unknown["activation_codec"] = {
        "fp4": {"encode_s_per_element": 1e-9, "decode_s_per_element": 1e-9}}
    write("profile", "bad_activation_codec.json", json.dumps(unknown))
    write("profile", "bad_not_profile.json", '{"format": "oases-plan", "version": 1}')
    write("profile", "bad_json.json", '{"format": "oases-profile", "version": 3, ')


def plan(degrees, tp=2, **extra):
    return json.dumps({"format": "oases-plan", "version": 1, "tp": tp, "degrees": degrees,
                       "predicted_step_s": 6.221, "predicted_memory_bytes": 166199296, **extra},
                      indent=2) + "\n"


def make_plans():
    write("plan", "valid_mixed.json", plan([2, 2, 2, 1]))
    write("plan", "valid_uniform.json", plan([2, 2, 2, 2]))
    write("plan", "valid_minimal.json",
          '{"format":"oases-plan","version":1,"tp":2,"degrees":[1,1,1,1]}')
    write("plan", "bad_tp.json", plan([4, 4, 2, 1], tp=4))
    write("plan", "bad_layers.json", plan([2, 1]))
    write("plan", "bad_degree.json", plan([2, 3, 2, 1]))
    write("plan", "bad_degree_type.json", plan([2, "1", 2, 1]))
    # A joint plan (`oases plan`): the settings a run takes besides the degrees.
    write("plan", "valid_settings.json",
          plan([2, 2, 2, 2], version=2,
               settings={"parallel.schedule": "cross-pass",
                         "parallel.recompute": "full,none,none,full",
                         "train.micro_batch": "4"}))
    write("plan", "bad_setting_type.json",
          plan([2, 2, 2, 2], version=2, settings={"train.micro_batch": 4}))
    write("plan", "bad_version.json", '{"format":"oases-plan","version":3,"tp":2,"degrees":[]}')
    write("plan", "bad_json.json", '{"format":"oases-plan",')


def main():
    for target in ("safetensors", "token_shard", "run_config", "profile", "plan"):
        shutil.rmtree(CORPUS / target, ignore_errors=True)
        (CORPUS / target).mkdir(parents=True)
    make_safetensors()
    make_token_shards()
    make_run_configs()
    make_profiles()
    make_plans()


if __name__ == "__main__":
    main()

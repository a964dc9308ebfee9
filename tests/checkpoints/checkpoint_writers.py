"""Writers that lay out objects the way Orbax, train_rl and to_huggingface do (maxtext.md)."""

from __future__ import annotations

import json
import struct


def put(bucket, name: str, data) -> None:
    if isinstance(data, (dict, list)):
        data = json.dumps(data)
    bucket.blob(name).upload_from_string(data)


LEAVES = [
    ("params", "decoder", "decoder_norm", "scale"),
    ("params", "decoder", "layers", "mlp", "wi_0", "kernel"),
    ("params", "token_embedder", "embedding"),
]


def write_orbax_step(bucket, step_prefix: str, items=("items",), *, commit=True, drop_leaf=None, custom=None):
    """A finished Orbax save without OCDBT: items, then _CHECKPOINT_METADATA, then commit_success.txt."""
    for item in items:
        tree = {}
        for keypath in LEAVES:
            tree[str(keypath)] = {
                "key_metadata": [{"key": k, "key_type": 2} for k in keypath],
                "value_metadata": {"value_type": "jax.Array", "skip_deserialize": False},
            }
            leaf = ".".join(keypath)
            if leaf == drop_leaf:
                continue
            put(bucket, f"{step_prefix}{item}/{leaf}/.zarray", {"zarr_format": 2, "shape": [4, 4]})
            put(bucket, f"{step_prefix}{item}/{leaf}/0.0", bytes(32))
        put(bucket, f"{step_prefix}{item}/_sharding", {})
        put(bucket, f"{step_prefix}{item}/_METADATA", {"tree_metadata": tree, "use_ocdbt": False, "use_zarr3": False})
    put(
        bucket,
        f"{step_prefix}_CHECKPOINT_METADATA",
        {
            "init_timestamp_nsecs": 1,
            "commit_timestamp_nsecs": 2 if commit else None,
            "custom_metadata": custom or {},
        },
    )
    if commit:
        put(bucket, f"{step_prefix}commit_success.txt", "Checkpoint commit was successful")


def safetensors(tensors: dict[str, int]) -> bytes:
    """A real safetensors file: tensors of the given byte sizes, uint8, laid out back to back."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, size in tensors.items():
        header[name] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + bytes(offset)


def write_hf_export(
    bucket, prefix: str, shards: int = 3, *, skip_shard=None, truncate_shard=None, index=True, generation_config=True
):
    """to_huggingface's upload order: tokenizer, config, shards, and the index last; then the package's copy of the
    model's generation_config.json (unless ``generation_config`` is False)."""
    put(bucket, f"{prefix}tokenizer_config.json", {"tokenizer_class": "Qwen2Tokenizer"})
    put(bucket, f"{prefix}tokenizer.json", {"version": "1.0"})
    put(bucket, f"{prefix}config.json", {"architectures": ["Qwen3MoeForCausalLM"]})
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        tensors = {f"layers.{i}.a": 64 * i, f"layers.{i}.b": 16}
        weight_map.update(dict.fromkeys(tensors, name))
        if i == skip_shard:
            continue
        data = safetensors(tensors)
        put(bucket, prefix + name, data[:-10] if i == truncate_shard else data)
    if index:
        put(bucket, f"{prefix}model.safetensors.index.json", {"metadata": {"total_size": 1}, "weight_map": weight_map})
    if generation_config:
        put(bucket, f"{prefix}generation_config.json", {"temperature": 0.7, "top_p": 0.8, "top_k": 20})

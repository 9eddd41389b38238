"""The lab hub's model repos: tiny look-alikes of the real targets and drafters.

Every byte is derived from the repo id and file name, so a rebuild on any
machine gives the same files, the same hashes and the same commit sha, and a
deploy can pin that sha.

Layout, read by lab.hub:
    STORE/models/{org}/{name}/files/{path}   the files, as a clone would hold them
    STORE/models/{org}/{name}/manifest.json  commit sha, gating, per-file size,
                                             git blob oid, sha256 and LFS flag
"""

import argparse
import base64
import hashlib
import json
import math
import os
import struct
import sys
from pathlib import Path

# Files stored through LFS, as huggingface.co's default .gitattributes decides.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".model")
LFS_MIN_SIZE = 10 * 1024 * 1024
GITATTRIBUTES = "".join(f"*{s} filter=lfs diff=lfs merge=lfs -text\n" for s in LFS_SUFFIXES)
LAST_MODIFIED = "2026-04-20T00:00:00.000Z"
BF16 = 2  # bytes per element; every tiny tensor is bfloat16

KIMI = "lab/Kimi-K2.6-tiny"
KIMI_DFLASH = "lab/Kimi-K2.6-DFlash-tiny"
QWEN = "lab/Qwen3.6-27B-tiny"
QWEN_DFLASH = "lab/Qwen3.6-27B-DFlash-tiny"
# The same model retrained: every tensor of the same shape, other values (the shards keep their
# names and sizes, only their bytes and hashes change); config and tokenizer are QWEN's. A mirror
# of Qwen/Qwen3.6-27B to it is a new revision of that repo to a host.
QWEN_RETRAINED = "lab/Qwen3.6-27B-tiny-retrained"


def repo_dir(store: Path, repo_id: str) -> Path:
    return Path(store) / "models" / repo_id


def seeded_bytes(seed: str, size: int) -> bytes:
    # SHAKE-256 is an endless, version-stable stream: same seed, same bytes.
    return hashlib.shake_256(seed.encode()).digest(size)


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def is_lfs(path: str, size: int) -> bool:
    return path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE


def file_entry(path: str, size: int, sha256: str, git_oid: str | None) -> dict:
    """Manifest entry; an LFS file's git oid is that of its pointer, as in git."""
    entry = {"path": path, "size": size, "sha256": sha256, "lfs": is_lfs(path, size)}
    if entry["lfs"]:
        pointer = lfs_pointer(sha256, size)
        entry.update(git_oid=git_blob_oid(pointer), pointer_size=len(pointer))
    else:
        entry["git_oid"] = git_oid
    return entry


def commit_sha(repo_id: str, entries: list[dict]) -> str:
    listing = "".join(f"{e['git_oid']} {e['path']}\n" for e in sorted(entries, key=lambda e: e["path"]))
    return hashlib.sha1(f"commit {repo_id}\n{listing}".encode()).hexdigest()


def write_manifest(store: Path, repo_id: str, gated: bool, entries: list[dict], extra: dict | None = None) -> str:
    sha = commit_sha(repo_id, entries)
    manifest = {"id": repo_id, "sha": sha, "gated": "manual" if gated else False,
                "last_modified": LAST_MODIFIED, "files": sorted(entries, key=lambda e: e["path"]), **(extra or {})}
    write_if_changed(repo_dir(store, repo_id) / "manifest.json", json.dumps(manifest, indent=1).encode())
    return sha


def write_if_changed(path: Path, data: bytes) -> None:
    # Rename into place so that a hub serving the old file never reads half of a new one.
    if path.exists() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def safetensors_header(tensors: list[tuple[str, str, list[int], int]]) -> bytes:
    """8-byte little-endian length plus the JSON header, padded to 8 bytes as the format asks."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape, nbytes in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_files(base: Path, files: dict[str, bytes]) -> list[dict]:
    """Write in-memory files under BASE; returns their manifest entries."""
    for path, data in files.items():
        write_if_changed(base / path, data)
    return [file_entry(path, len(data), hashlib.sha256(data).hexdigest(), git_blob_oid(data))
            for path, data in files.items()]


def build_repo(store: Path, repo_id: str, gated: bool, files: dict[str, bytes]) -> str:
    entries = write_files(repo_dir(store, repo_id) / "files", {".gitattributes": GITATTRIBUTES.encode(), **files})
    return write_manifest(store, repo_id, gated, entries)


def sharded_weights(repo_id: str, tensors: list[tuple[str, list[int]]], shards: int) -> dict[str, bytes]:
    """bf16 safetensors shards of about equal size plus the index that maps them."""
    total = sum(math.prod(shape) * BF16 for _, shape in tensors)
    groups, current, filled = [], [], 0
    for name, shape in tensors:
        current.append((name, shape))
        filled += math.prod(shape) * BF16
        if filled >= total * (len(groups) + 1) / shards and len(groups) < shards - 1:
            groups.append(current)
            current = []
    groups.append(current)
    assert len(groups) == shards, f"{repo_id}: {len(tensors)} tensors do not fill {shards} shards"

    files, weight_map = {}, {}
    for i, group in enumerate(groups, 1):
        shard = f"model-{i:05d}-of-{shards:05d}.safetensors" if shards > 1 else "model.safetensors"
        layout = [(name, "BF16", shape, math.prod(shape) * BF16) for name, shape in group]
        body = b"".join(seeded_bytes(f"{repo_id}:{name}", nbytes) for name, _, _, nbytes in layout)
        files[shard] = safetensors_header(layout) + body
        weight_map.update((name, shard) for name, _ in group)
    if shards > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        files["model.safetensors.index.json"] = to_json(index)
    return files


def to_json(obj) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def readme(repo_id: str, base_model: str, body: str, gated: bool) -> bytes:
    front = ["---", "license: other", "library_name: transformers", f"base_model: {base_model}"]
    if gated:
        front.append("extra_gated_prompt: Lab terms. Accept them to download the drafter.")
    return ("\n".join(front + ["---", "", f"# {repo_id}", "", body, ""])).encode()


def tiktoken_model(repo_id: str, vocab_size: int) -> bytes:
    """tiktoken's BPE rank file: base64 token, space, rank. 256 byte tokens, then seeded merges."""
    tokens = [bytes([b]) for b in range(256)]
    stream = seeded_bytes(f"{repo_id}:tiktoken", 4 * vocab_size)
    tokens += [stream[i:i + 2 + i % 3] for i in range(0, 4 * (vocab_size - 256), 4)]
    return b"".join(base64.b64encode(t) + b" %d\n" % rank for rank, t in enumerate(tokens))


def mla_moe_layer(prefix: str, cfg: dict, dense: bool) -> list[tuple[str, list[int]]]:
    """One DeepSeek-V3 layer (MLA attention, then a dense or routed-expert MLP), as Kimi K2 names it."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    qk_head = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    t = [
        (f"{prefix}.input_layernorm.weight", [h]),
        (f"{prefix}.self_attn.q_a_proj.weight", [cfg["q_lora_rank"], h]),
        (f"{prefix}.self_attn.q_a_layernorm.weight", [cfg["q_lora_rank"]]),
        (f"{prefix}.self_attn.q_b_proj.weight", [heads * qk_head, cfg["q_lora_rank"]]),
        (f"{prefix}.self_attn.kv_a_proj_with_mqa.weight", [cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], h]),
        (f"{prefix}.self_attn.kv_a_layernorm.weight", [cfg["kv_lora_rank"]]),
        (f"{prefix}.self_attn.kv_b_proj.weight",
         [heads * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), cfg["kv_lora_rank"]]),
        (f"{prefix}.self_attn.o_proj.weight", [h, heads * cfg["v_head_dim"]]),
        (f"{prefix}.post_attention_layernorm.weight", [h]),
    ]
    if dense:
        return t + mlp(f"{prefix}.mlp", h, cfg["intermediate_size"])
    t.append((f"{prefix}.mlp.gate.weight", [cfg["n_routed_experts"], h]))
    t.append((f"{prefix}.mlp.gate.e_score_correction_bias", [cfg["n_routed_experts"]]))
    for e in range(cfg["n_routed_experts"]):
        t += mlp(f"{prefix}.mlp.experts.{e}", h, cfg["moe_intermediate_size"])
    return t + mlp(f"{prefix}.mlp.shared_experts", h, cfg["moe_intermediate_size"] * cfg["n_shared_experts"])


def mlp(prefix: str, hidden: int, inner: int) -> list[tuple[str, list[int]]]:
    return [(f"{prefix}.gate_proj.weight", [inner, hidden]), (f"{prefix}.up_proj.weight", [inner, hidden]),
            (f"{prefix}.down_proj.weight", [hidden, inner])]


def gqa_layer(prefix: str, hidden: int, heads: int, kv_heads: int, head_dim: int, inner: int):
    return [
        (f"{prefix}.input_layernorm.weight", [hidden]),
        (f"{prefix}.self_attn.q_proj.weight", [heads * head_dim, hidden]),
        (f"{prefix}.self_attn.k_proj.weight", [kv_heads * head_dim, hidden]),
        (f"{prefix}.self_attn.v_proj.weight", [kv_heads * head_dim, hidden]),
        (f"{prefix}.self_attn.o_proj.weight", [hidden, heads * head_dim]),
        (f"{prefix}.self_attn.q_norm.weight", [head_dim]),
        (f"{prefix}.self_attn.k_norm.weight", [head_dim]),
        (f"{prefix}.post_attention_layernorm.weight", [hidden]),
    ] + mlp(f"{prefix}.mlp", hidden, inner)


KIMI_TEXT_CONFIG = {
    "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"],
    "num_hidden_layers": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "hidden_size": 512, "intermediate_size": 1536, "moe_intermediate_size": 256,
    "n_routed_experts": 12, "n_shared_experts": 1, "num_experts_per_tok": 4,
    "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
    "routed_scaling_factor": 2.827, "norm_topk_prob": True,
    "num_attention_heads": 8, "num_key_value_heads": 8,
    "q_lora_rank": 192, "kv_lora_rank": 128, "qk_rope_head_dim": 32, "qk_nope_head_dim": 64, "v_head_dim": 64,
    "vocab_size": 4096, "max_position_embeddings": 262144, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "rope_theta": 50000.0,
    "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
                     "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


# The real repo ships its config class as remote code (config.json's auto_map), and with
# --trust-remote-code SGLang loads the config through it: the same shape, reduced to what
# builds the config (DeepSeek-V3 text model plus vision tower settings).
KIMI_CONFIG_CODE = b'''"""Kimi K2.5/K2.6 configuration (lab copy of the remote code the real repo ships)."""

from transformers import DeepseekV3Config, PretrainedConfig


class KimiK25Config(PretrainedConfig):
    model_type = "kimi_k25"

    def __init__(self, text_config=None, vision_config=None, media_placeholder_token_id=163605, **kwargs):
        if not isinstance(text_config, PretrainedConfig):
            text_config = DeepseekV3Config(**(text_config or {}))
        self.text_config = text_config
        self.vision_config = vision_config or {}
        self.media_placeholder_token_id = media_placeholder_token_id
        super().__init__(**kwargs)
'''


def kimi_files() -> dict[str, bytes]:
    text = KIMI_TEXT_CONFIG
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config",
                     "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration"},
        "model_type": "kimi_k25", "torch_dtype": "bfloat16", "media_placeholder_token_id": 4095,
        "text_config": text,
        "vision_config": {"model_type": "moonvit", "hidden_size": 64, "patch_size": 14, "num_hidden_layers": 1},
    }
    h = text["hidden_size"]
    lm = "language_model.model"
    tensors = [(f"{lm}.embed_tokens.weight", [text["vocab_size"], h])]
    for i in range(text["num_hidden_layers"]):
        tensors += mla_moe_layer(f"{lm}.layers.{i}", text, dense=i < text["first_k_dense_replace"])
    tensors += [
        (f"{lm}.norm.weight", [h]),
        ("language_model.lm_head.weight", [text["vocab_size"], h]),
        ("vision_tower.patch_embed.proj.weight", [64, 3, 14, 14]),
        ("mm_projector.proj.0.weight", [h, 64]),
    ]
    return {
        "config.json": to_json(config),
        "configuration_kimi_k25.py": KIMI_CONFIG_CODE,
        **sharded_weights(KIMI, tensors, shards=4),
        "generation_config.json": to_json({"bos_token_id": 1, "eos_token_id": 2, "max_length": 262144}),
        "tiktoken.model": tiktoken_model(KIMI, text["vocab_size"] - 16),
        "tokenizer_config.json": to_json({
            "tokenizer_class": "TikTokenTokenizer",
            "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
            "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
            "model_max_length": 262144,
        }),
        "README.md": readme(KIMI, "moonshotai/Kimi-K2.6",
                            "Tiny random-weight stand-in laid out like moonshotai/Kimi-K2.6.", gated=False),
    }


def dflash_files(repo_id: str, target: str, hidden: int, target_layers: int, block_size: int,
                 vocab_size: int) -> dict[str, bytes]:
    """A DFlash drafter: a few Qwen3 layers fed by hidden states from the target's layers."""
    layers, heads, kv_heads, head_dim, inner = 2, 4, 2, hidden // 8, hidden
    target_layer_ids = sorted({round(i * (target_layers - 1) / (layers - 1)) for i in range(layers)})
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "intermediate_size": inner,
        "vocab_size": vocab_size, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
        "num_target_layers": target_layers, "block_size": block_size,
        "dflash_config": {"block_size": block_size, "target_layer_ids": target_layer_ids,
                          "mask_token_id": vocab_size - 1},
        "torch_dtype": "bfloat16",
    }
    tensors = [("fc.weight", [hidden, hidden * len(target_layer_ids)]), ("hidden_norm.weight", [hidden])]
    for i in range(layers):
        tensors += gqa_layer(f"layers.{i}", hidden, heads, kv_heads, head_dim, inner)
    tensors.append(("norm.weight", [hidden]))
    return {
        "config.json": to_json(config),
        **sharded_weights(repo_id, tensors, shards=1),
        "README.md": readme(repo_id, target, f"Tiny DFlash drafter (block size {block_size}) for {target}.",
                            gated=True),
    }


QWEN_CONFIG = {
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5",
    "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "full_attention_interval": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
    "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 32,
    "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4,
    "vocab_size": 4096, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "rope_theta": 10000000,
    "partial_rotary_factor": 0.25, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "bos_token_id": 1, "eos_token_id": 2,
}


def qwen_files(seed: str = QWEN) -> dict[str, bytes]:
    """QWEN's files; another `seed` gives its tensors other values of the same shapes."""
    c = QWEN_CONFIG
    h = c["hidden_size"]
    tensors = [("model.embed_tokens.weight", [c["vocab_size"], h])]
    for i, kind in enumerate(c["layer_types"]):
        p = f"model.layers.{i}"
        if kind == "full_attention":
            layer = gqa_layer(p, h, c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                              c["intermediate_size"])
        else:
            # Gated DeltaNet: fused qkvz and ba projections, a short conv, per-head decay.
            k = c["linear_num_key_heads"] * c["linear_key_head_dim"]
            v = c["linear_num_value_heads"] * c["linear_value_head_dim"]
            layer = [
                (f"{p}.input_layernorm.weight", [h]),
                (f"{p}.linear_attn.in_proj_qkvz.weight", [2 * k + 2 * v, h]),
                (f"{p}.linear_attn.in_proj_ba.weight", [2 * c["linear_num_value_heads"], h]),
                (f"{p}.linear_attn.conv1d.weight", [2 * k + v, 1, c["linear_conv_kernel_dim"]]),
                (f"{p}.linear_attn.A_log", [c["linear_num_value_heads"]]),
                (f"{p}.linear_attn.dt_bias", [c["linear_num_value_heads"]]),
                (f"{p}.linear_attn.norm.weight", [c["linear_value_head_dim"]]),
                (f"{p}.linear_attn.out_proj.weight", [h, v]),
                (f"{p}.post_attention_layernorm.weight", [h]),
            ] + mlp(f"{p}.mlp", h, c["intermediate_size"])
        tensors += layer
    tensors += [("model.norm.weight", [h]), ("lm_head.weight", [c["vocab_size"], h])]
    vocab = {f"<t{i}>": i for i in range(c["vocab_size"])}
    return {
        "config.json": to_json(c),
        **sharded_weights(seed, tensors, shards=2),
        "generation_config.json": to_json({"bos_token_id": 1, "eos_token_id": 2, "temperature": 0.6}),
        "tokenizer.json": to_json({"version": "1.0", "model": {"type": "BPE", "vocab": vocab, "merges": []}}),
        "tokenizer_config.json": to_json({"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<t2>",
                                          "model_max_length": 262144}),
        "README.md": readme(QWEN, "Qwen/Qwen3.6-27B", "Tiny random-weight Qwen3.6-style hybrid model.",
                            gated=False),
    }


def build_lab_repos(store: Path) -> dict[str, str]:
    """Write the lab's repos under STORE; returns repo id -> commit sha."""
    kimi, qwen = KIMI_TEXT_CONFIG, QWEN_CONFIG
    return {
        KIMI: build_repo(store, KIMI, False, kimi_files()),
        KIMI_DFLASH: build_repo(store, KIMI_DFLASH, True, dflash_files(
            KIMI_DFLASH, KIMI, kimi["hidden_size"], kimi["num_hidden_layers"], 8, kimi["vocab_size"])),
        QWEN: build_repo(store, QWEN, False, qwen_files()),
        QWEN_RETRAINED: build_repo(store, QWEN_RETRAINED, False, qwen_files(seed=QWEN_RETRAINED)),
        QWEN_DFLASH: build_repo(store, QWEN_DFLASH, True, dflash_files(
            QWEN_DFLASH, QWEN, qwen["hidden_size"], qwen["num_hidden_layers"], 16, qwen["vocab_size"])),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.repos")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="write the lab repos and print repo -> commit sha as JSON")
    build.add_argument("--store", required=True, type=Path)
    args = parser.parse_args(argv)
    json.dump(build_lab_repos(args.store), sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()

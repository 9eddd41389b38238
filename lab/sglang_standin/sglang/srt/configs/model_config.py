"""LAB STAND-IN for SGLang 0.5.23's model config (srt/configs/model_config.py ModelConfig): what the startup
arithmetic reads of a model — its context length, whether its class is multimodal, a hybrid model's
recurrent-state layers — from config.json as transformers reads it (the text config of a nested one).

get_context_length (utils/hf_transformers/common.py) and ModelConfig._derive_context_length are the
release's text, copied verbatim (checked against the wheel in tests/lab_code/test_sglang_kv_pool.py): the
context a server takes is SGLang's answer, its refusal of a --context-length above the model's included.
"""

import logging
from enum import Enum, auto
from types import SimpleNamespace

from sglang.srt.environ import envs
from sglang.srt.resolution import read_config

logger = logging.getLogger(__name__)
# configs/model_config.py multimodal_model_archs: the classes among the lab's models that are multimodal.
MULTIMODAL_ARCHS = {"KimiK25ForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                    "Qwen3_5MoeForConditionalGeneration"}
# The lab's models whose attention is MLA (configs/model_config.py: DeepSeek V2/V3 and Kimi K2.x's text model).
MLA_ARCHS = {"DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "KimiK25ForConditionalGeneration"}


def is_in_ci() -> bool:
    return envs.SGLANG_IS_IN_CI.get()


# ---- COPIED from the 0.5.23 wheel, srt/utils/hf_transformers/common.py ----
CONTEXT_LENGTH_KEYS = [
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
]


def get_context_length(config):
    """Get the context length of a model from a huggingface model configs."""
    text_config = config
    rope_scaling = getattr(text_config, "rope_scaling", None)
    if rope_scaling:
        rope_scaling_factor = rope_scaling.get("factor", 1)
        if "original_max_position_embeddings" in rope_scaling:
            rope_scaling_factor = 1
        if rope_scaling.get("rope_type", None) == "llama3":
            rope_scaling_factor = 1
    else:
        rope_scaling_factor = 1

    for key in CONTEXT_LENGTH_KEYS:
        val = getattr(text_config, key, None)
        if val is not None:
            return int(rope_scaling_factor * val)
    return 2048
# ---- end of COPIED ----


class AttentionArch(Enum):
    MLA = auto()
    MHA = auto()


class ModelConfig:
    """A model folder's config.json as the scheduler's ModelConfig presents it (`config`: the dict itself)."""

    def __init__(self, model_path: str, trust_remote_code: bool = True, context_length: int | None = None,
                 is_draft_model: bool = False):
        self.model_path, self.is_draft_model = model_path, is_draft_model
        self.config = read_config(model_path)
        self.hf_config = SimpleNamespace(**self.config)
        text = self.config.get("text_config") or self.config
        self.hf_text_config = SimpleNamespace(**text)
        architecture = (self.config.get("architectures") or [""])[0]
        self.is_multimodal = architecture in MULTIMODAL_ARCHS
        self.attention_arch = AttentionArch.MLA if architecture in MLA_ARCHS else AttentionArch.MHA
        self.num_hidden_layers = text["num_hidden_layers"]
        self.dtype = text.get("dtype") or text.get("torch_dtype") or "bfloat16"
        self._derive_context_length(context_length)

    @staticmethod
    def from_server_args(server_args, model_path: str | None = None, is_draft_model: bool = False) -> "ModelConfig":
        return ModelConfig(model_path or server_args.model_path, server_args.trust_remote_code,
                           server_args.context_length, is_draft_model)

    # ---- COPIED from the 0.5.23 wheel, srt/configs/model_config.py (ModelConfig) ----
    def _derive_context_length(self, context_length: int):
        is_draft_model = self.is_draft_model
        derived_context_len = get_context_length(self.hf_text_config)

        if context_length is not None:
            if context_length > derived_context_len:
                reason = "Target model's" if is_draft_model else "User-specified"
                msg = (
                    f"Warning: {reason} context_length ({context_length}) is greater than the derived context_length ({derived_context_len}). "
                    f"This may lead to incorrect model outputs or CUDA errors. Note that the derived context_length may differ from max_position_embeddings in the model's config."
                )
                if (
                    envs.SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN.get()
                    or is_in_ci()  # FIXME: fix this special case
                ):
                    logger.warning(msg)
                    self.context_len = context_length
                    if is_draft_model:
                        self.hf_text_config.max_position_embeddings = context_length
                        logger.warning(
                            f"Overriding the draft model's max_position_embeddings to {context_length}."
                        )
                else:
                    raise ValueError(
                        f"{msg} To allow overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
                    )
            else:
                self.context_len = context_length
        else:
            if (
                self.hf_config.architectures
                and self.hf_config.architectures[0] == "EmbeddingGemma2Model"
            ):
                self.context_len = min(derived_context_len, 8192)
            else:
                self.context_len = derived_context_len

        # Transfer context_len to HuggingFace config so models can access it
        self.hf_config.context_len = self.context_len

    # ---- end of COPIED ----

"""LAB STAND-IN for SGLang 0.5.23's SpecAuxHiddenStateConfig
(srt/model_executor/model_runner_components/spec_aux_hidden_state.py): what the target's pool learns of a
DFlash drafter."""

from dataclasses import dataclass
from typing import Any


@dataclass(kw_only=True)
class SpecAuxHiddenStateConfig:
    dflash_draft_num_layers: int | None = None
    draft_model_config: Any = None

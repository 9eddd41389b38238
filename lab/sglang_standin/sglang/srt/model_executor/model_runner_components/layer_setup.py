"""LAB STAND-IN for SGLang 0.5.23's ModelLayerInfo (srt/model_executor/model_runner_components/layer_setup.py):
the layers a runner owns."""

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ModelLayerInfo:
    start_layer: int
    end_layer: int
    num_effective_layers: int

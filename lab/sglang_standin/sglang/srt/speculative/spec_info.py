"""LAB STAND-IN for SGLang 0.5.23's srt/speculative/spec_info.py: the questions the startup asks of the
speculative algorithm."""


class SpeculativeAlgorithm:
    def __init__(self, name: str | None):
        self.name = name

    @staticmethod
    def from_string(name: str | None) -> "SpeculativeAlgorithm":
        return SpeculativeAlgorithm(name.upper() if name else None)

    def is_none(self) -> bool:
        return self.name is None

    def is_dflash_family(self) -> bool:
        return self.name in ("DFLASH", "DDTREE")  # DDTree (PR #29907) drafts with DFlash's worker

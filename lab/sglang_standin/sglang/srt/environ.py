"""LAB STAND-IN for SGLang 0.5.23's environment settings (srt/environ.py): the few the startup arithmetic
reads, with the release's names, defaults and parsing (EnvBool: true/1/yes/y, false/0/no/n; EnvInt: int)."""

import os


class EnvField:
    def __init__(self, name: str, default):
        self.name, self.default = name, default

    def get(self):
        value = os.getenv(self.name)
        return self.default if value is None else self.parse(value)


class EnvBool(EnvField):
    def parse(self, value: str) -> bool:
        value = value.lower()
        if value in ["true", "1", "yes", "y"]:
            return True
        if value in ["false", "0", "no", "n"]:
            return False
        raise ValueError(f'"{value}" is not a valid boolean value')


class EnvInt(EnvField):
    def parse(self, value: str) -> int:
        try:
            return int(value)
        except ValueError:
            raise ValueError(f'"{value}" is not a valid integer value')


class Envs:
    SGLANG_VLM_CACHE_SIZE_MB = EnvInt("SGLANG_VLM_CACHE_SIZE_MB", 100)
    SGLANG_MM_FEATURE_CACHE_MB = EnvInt("SGLANG_MM_FEATURE_CACHE_MB", 1 * 1024)
    SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK = EnvBool("SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK", False)
    SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN = EnvBool("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", False)
    SGLANG_IS_IN_CI = EnvBool("SGLANG_IS_IN_CI", False)


envs = Envs()

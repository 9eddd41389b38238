"""LAB STAND-IN for SGLang's `sglang.srt` package; holds only server_args."""

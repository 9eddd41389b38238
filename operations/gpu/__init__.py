"""The host and its GPUs: hardware truth (facts, parsers, the class check, the classify CLI), the
driver and its runtime (NVIDIA's repository, open driver, reboot, persistence, fabric manager, holds)
and the GPU smoke test. `runtime` is the one place that decides what the driver concern does on a host."""

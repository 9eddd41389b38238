"""LAB STAND-IN for SGLang 0.5.23's runtime context (srt/runtime_context.py): the config bags the startup
arithmetic reads (get_schedule, get_exec, get_memory, get_spec, get_disagg, get_mm, get_parallel,
get_context().override), projected from the resolved server arguments by `publish`, as the real one
projects them. Only the leaves that arithmetic reads are here, with the values a single-node server
without disaggregation, DCP, PP, unified memory or ReplaySSM has (the layouts a specfleet deploy runs);
`publish` refuses a command line outside that, rather than answer for it.

The device bag carries what the stand-in's model load measured (free_gb, the rank's free memory once its
weights are on the card), which its get_available_gpu_memory answers. The names and signatures are the
release's, so that what drives the real startup (the deploy's engine check) drives this one alike.
"""

from types import SimpleNamespace as Bag

# arg_groups/fields/schedule.py: mamba_full_memory_ratio's fallback when the flag is not given.
MAMBA_FULL_MEMORY_RATIO_FALLBACK = 0.9


class RuntimeContext:
    def __init__(self, bags: dict):
        self.bags = bags

    def override(self, _source: str, **values) -> None:
        """Runtime overrides of schedule leaves (the mamba pool's size), as the real context records them."""
        for key, value in values.items():
            setattr(self.bags["schedule"], key, value)


class SpawnRanks:
    """The launcher's placement of a process (the stand-in runs every rank alike)."""

    def __init__(self, world_rank: int, dp_rank: int | None, gpu_id: int):
        self.world_rank, self.dp_rank, self.gpu_id = world_rank, dp_rank, gpu_id


class ParallelContext(Bag):
    def override_permanently(self, **values) -> None:
        self.__dict__.update(values)


_CONTEXT: RuntimeContext | None = None


def mamba_extra_buffer_of(args) -> bool:
    """arg_groups/model_override_base.py mamba_extra_buffer_of."""
    return args.disable_radix_cache is False and args.mamba_radix_cache_strategy in (
        "extra_buffer", "extra_buffer_lazy")


def publish(server_args, *, role: str, ranks: SpawnRanks | None = None) -> RuntimeContext:
    """Project the resolved `server_args` into the bags, for the process of `role` (the stand-in's are
    every rank alike), once they are resolved."""
    global _CONTEXT
    args = server_args
    if args.pp_size != 1 or args.dp_size != 1 or args.attn_dp_size != 1 or args.disaggregation_mode != "null":
        raise NotImplementedError("the lab stand-in sizes a single-stage server without data parallelism or "
                                  "disaggregation only")
    extra = mamba_extra_buffer_of(args)
    ratio = args.mamba_full_memory_ratio
    _CONTEXT = RuntimeContext({
        "schedule": Bag(mem_fraction_static=args.mem_fraction_static, prefill_max_requests=None,
                        max_mamba_cache_size=args.max_mamba_cache_size,
                        mamba_full_memory_ratio=MAMBA_FULL_MEMORY_RATIO_FALLBACK if ratio is None else ratio,
                        max_running_requests=args.max_running_requests, page_size=args.page_size,
                        disable_overlap_schedule=args.disable_overlap_schedule,
                        max_total_tokens=args.max_total_tokens),
        "exec": Bag(graph=Bag(cuda_graph_config=Bag(prefill=Bag(full_prefill_max_req=None, backend=None))),
                    mamba=Bag(enable_mamba_extra_buffer=extra,
                              enable_mamba_extra_buffer_lazy=extra and args.mamba_radix_cache_strategy
                              == "extra_buffer_lazy",
                              enable_linear_replayssm_spec=False)),
        "memory": Bag(disable_radix_cache=args.disable_radix_cache, enable_unified_memory=False),
        "spec": Bag(speculative_num_draft_tokens=args.speculative_num_draft_tokens,
                    speculative_draft_kv_cache_dtype=args.speculative_draft_kv_cache_dtype),
        "model": Bag(kv_cache_dtype=args.kv_cache_dtype, mamba_ssm_dtype=args.mamba_ssm_dtype),
        "disagg": Bag(disaggregation_mode="null", enable_pd_role_switch=False),
        "mm": Bag(mm_feature_transport=None),
        "parallel": ParallelContext(tp_size=args.tp_size, attn_tp_size=args.tp_size,
                                    launch_world_size=args.tp_size * args.pp_size, pp_size=args.pp_size, attn_dp_size=1,
                                    attn_dcp_size=1, world_group=Bag(cpu_group=None)),
        "device": Bag(free_gb=None, gpu_id=ranks.gpu_id if ranks is not None else None),
    })
    return _CONTEXT


def get_context() -> RuntimeContext:
    return _CONTEXT


def get_schedule():
    return _CONTEXT.bags["schedule"]


def get_exec():
    return _CONTEXT.bags["exec"]


def get_memory():
    return _CONTEXT.bags["memory"]


def get_spec():
    return _CONTEXT.bags["spec"]


def get_model():
    return _CONTEXT.bags["model"]


def get_disagg():
    return _CONTEXT.bags["disagg"]


def get_mm():
    return _CONTEXT.bags["mm"]


def get_parallel():
    return _CONTEXT.bags["parallel"]


def get_device():
    return _CONTEXT.bags["device"]

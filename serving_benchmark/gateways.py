"""The bench through the gateways: with the deployed replicas serving again and back in their gateways,
each level through every gateway of their model whose only workers of it they are, with the API key,
as its clients get them."""

from pathlib import Path

from deployment import knobs, network
from deployment.gateway.membership import Route
from deployment.server.config import Server
from serving_benchmark import behind_gateway
from serving_benchmark.client import measure
from serving_benchmark.plan import Plan
from serving_benchmark.remote import clean, request, run_directory


def generated_tokens(metrics: str) -> float:
    """The tokens a server generated since it started: SGLang's `sglang:generation_tokens_total` in its /metrics."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("sglang:generation_tokens_total"))


def gateway_problem(listing: dict, route: Route, replicas: tuple[Server, ...]) -> str | None:
    """Why the figures through `route`'s gateway would not be these replicas' (their host's) alone: the
    gateway did not answer, or its workers of their model are not exactly them (it also routes to
    another host, or lacks one of them), or its inventory name would not make one plain directory of the
    results (on the host and on the controller). None when they are."""
    d = replicas[0]
    if not knobs.UNIT_NAME.fullmatch(route.gateway):
        return (f"its inventory name {route.gateway!r} is not a plain name (letters, digits, _.-), which its "
                "results' directory takes")
    if not route.address:
        return f"its API listens on {route.control.bind_address} only, which this host's client cannot reach"
    if not listing.get("reachable"):
        return f"{route.gateway} did not answer ({listing.get('error', 'unreachable')})"
    listed = {w["url"] for w in listing.get("workers", [])}
    wanted = {route.worker_url(r.port) for r in replicas}
    if listed - wanted:
        others = sorted(listed - wanted)
        return (f"{route.gateway} also routes {d.engine.served_model_name} to {len(others)} other worker(s) "
                f"({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}): its figures would not be this "
                "host's alone")
    if wanted - listed:
        return f"{route.gateway} does not route to {', '.join(sorted(wanted - listed))}"
    return None


def through_gateways(host, replicas: tuple[Server, ...], plan: Plan, remote_root: str, out: Path,
                     routes: list) -> dict:
    """The deployed replicas, back in their gateways: each level through each gateway of their model
    whose workers of it are exactly them (``gateway_problem``), with their API key, as their clients
    get them (the gateway's policy spreading the requests). Per gateway, its levels and the tokens each
    replica generated meanwhile, or why it was skipped or failed."""
    d = replicas[0]
    mode = d.engine.speculative.algorithm.lower()
    passes = {}
    for route in routes:
        name = route.gateway
        problem = route.problem or gateway_problem(behind_gateway.listing_now(host, route, d.engine.served_model_name), route,
                                                   replicas)
        if problem:
            passes[name] = {"skipped": f"through {name} skipped: {problem}"}
            host.log_styled(passes[name]["skipped"], fg="yellow")
            continue
        url = network.url(route.address, route.port)
        result = passes[name] = {"url": url, "mode": mode, "levels": {}}
        before = [generated_tokens(request(host, r, "/metrics", key_file=r.engine.service.api_key_file)) for r in replicas]
        remote = f"{remote_root}/gateway-{name}"
        run_directory(host, d.engine.user, remote_root)
        try:
            for concurrency in plan.concurrency:
                where = f"gateway-{name}/{mode}/c{concurrency}/"
                host.log(f"bench {mode} through {name}: concurrency {concurrency}, "
                         f"{plan.requests_at(concurrency)} requests over {len(replicas)} replica(s)")
                measured, progress = measure(host, d, plan, f"{remote}/{mode}/c{concurrency}",
                                             out / "raw" / where.rstrip("/"), where, concurrency, replicas, url)
                if measured is None:
                    result["failed"] = f"the client failed at concurrency {concurrency} (raw/{where}client.log)"
                    host.log_styled(result["failed"], fg="red")
                    break
                level = result["levels"][str(concurrency)] = measured["level"]
                host.log(f"bench {mode} through {name}: concurrency {concurrency}: {level['output_tok_s']:.1f} "
                         f"output tok/s, {level['request_s']:.2f} req/s, accept length {level['accept_length']} "
                         f"({progress})")
        finally:
            clean(host, d.engine.user, remote_root)
        after = [generated_tokens(request(host, r, "/metrics", key_file=r.engine.service.api_key_file)) for r in replicas]
        result["generated_tokens"] = {r.service_name: round(a - b) for r, b, a in zip(replicas, before, after)}
        host.log(f"bench through {name}: tokens each replica generated: "
                 + ", ".join(f"{r.service_name} {n}" for r, n in zip(replicas, result["generated_tokens"].values())))
    return passes

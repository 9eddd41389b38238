"""The bench's modes, one a speculative algorithm of deployment/server/speculative.py (ar: none): each
mode's command line from the deployed server's, and whether the host's SGLang accepts it."""

import dataclasses

from pyinfra import host

from deployment import network
from deployment.server import speculative
from deployment.server.command_line import server_args
from deployment.server.config import Server, speculative_of
from operations.server.sandbox import rejection


def on_loopback(server: Server) -> Server:
    """The server as a bench unit serves it: on loopback only, so no API key is needed and none is handed out."""
    e = server.engine
    return dataclasses.replace(server, engine=dataclasses.replace(
        e, service=dataclasses.replace(e.service, bind_address=network.LOOPBACK)))


def shares_drafter(entry: speculative.Algorithm, other: speculative.Algorithm) -> bool:
    """Whether a drafter trained for `other` drafts for `entry` too: a drafter is trained for its algorithm,
    and one built on it (`Algorithm.base`: DDTree grows DFlash's chain) takes it as it is; another's (an
    EAGLE-3 head for a DFlash drafter) would load it as what it is not."""
    return (entry.base or entry.name) == (other.base or other.name)


def mode_args(server: Server, mode: str) -> list[str]:
    """The deployed server's arguments for `mode`, served on loopback only.

    A mode that does not draft (ar) drops every speculative flag; the others keep the deployed drafter
    and block size, with the mode's own settings (speculative.Speculative.as_mode: ddtree's budget
    defaults to block - 1, spine mode), the target backend and the page size its rules ask (ddtree:
    one-token pages, and triton where it builds a tree).
    """
    e = server.engine
    d = on_loopback(server)
    entry = speculative.of_mode(mode)
    if not entry.drafts:
        args, drop = [], False
        for arg in server_args(d):
            if drop:
                drop = False
            elif arg.startswith("--speculative-"):
                drop = True  # every speculative flag takes a value
            else:
                args.append(arg)
        return args
    spec = e.speculative.as_mode(mode)
    args = server_args(dataclasses.replace(d, engine=dataclasses.replace(
        d.engine, speculative=spec,
        attention_backend=entry.target_backend(e.attention_backend, spec.num_draft_tokens, spec.tree_size))))
    if entry.page_size is not None and "--page-size" not in args:
        args += ["--page-size", str(entry.page_size)]
    return args


def of_model(profiles: dict, profile_name: str) -> dict[str, speculative.Speculative]:
    """Per mode, the speculative settings a profile of `profile_name`'s target model names for it (the first
    such profile's): what the bench serves a mode with that the deployed drafter does not derive (MTP: the
    model's own draft layers, at its profile's steps)."""
    model = profiles[profile_name]["target"]["repo"]
    found = {}
    for name, profile in profiles.items():
        if isinstance(profile, dict) and profile.get("speculative") and profile.get("target", {}).get("repo") == model:
            spec = speculative_of(name, profile)
            found.setdefault(spec.entry.mode, spec)
    return found


def as_served(server: Server, mode: str, settings: dict[str, speculative.Speculative]) -> Server:
    """The server `mode` is derived from: the deployed one (mode_args keeps its drafter and draft tokens),
    but for an algorithm that loads no drafter and that a profile of the model names (`of_model`), the
    deployed one with that profile's settings."""
    entry = speculative.of_mode(mode)
    if not entry.drafts or entry.drafter or entry is server.engine.speculative.entry or mode not in settings:
        return server
    return dataclasses.replace(server, engine=dataclasses.replace(server.engine, speculative=settings[mode]))


def accepted(server: Server, modes: tuple[str, ...], settings: dict[str, speculative.Speculative]) -> dict[str, dict]:
    """Per mode, its command line ({"server_args": [...]}) or why it is skipped ({"skipped": "..."}): the
    host's installed SGLang asked as the deploy asks it (the service user, offline, with the unit's
    environment; the replicas' command lines differ in their port only); `settings`: `of_model`'s."""
    found, deployed_server = {}, server
    for mode in modes:
        server = as_served(deployed_server, mode, settings)
        entry = speculative.of_mode(mode)
        if entry.drafter and server.engine.draft_model_dir is None:
            found[mode] = {"skipped": f"{mode} skipped: {server.engine.profile_name} has no drafter to draft with"}
            continue
        deployed = server.engine.speculative.entry
        if entry.drafter and not shares_drafter(entry, deployed):
            found[mode] = {"skipped": f"{mode} skipped: {server.engine.profile_name}'s drafter drafts for "
                                      f"{deployed.label or deployed.name}, not {entry.label or entry.name}"}
            continue
        args = mode_args(server, mode)
        rejected = rejection(host, server, args)
        if rejected and entry.pull_request:
            found[mode] = {"skipped": f"{mode} skipped: no {entry.label} build is deployed (the SGLang in "
                                      f"{server.engine.venv} rejects its flags: {rejected})"}
        elif rejected:
            found[mode] = {"skipped": f"{mode} skipped: the SGLang in {server.engine.venv} rejects its flags: {rejected}"}
        else:
            found[mode] = {"server_args": args}
    return found

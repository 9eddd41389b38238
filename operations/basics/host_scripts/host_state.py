"""Runs ON THE HOST (sent inline, as root: it only reads): the whole state a deploy compares against,
in one Python start.

Usage: host_state.py REQUESTS, where REQUESTS is JSON [[fact, {argument: value}, "module.function",
how], ...]: each fact the deploy's operations read, with the function of a host program that answers
it (operations/basics/gathering.py sends those programs along). Each function prints, as a list of
lines, what that fact's own shell command prints, so the fact's process() parses them alike;
None where it cannot answer exactly (the controller then runs that fact's own command). `how` is
"fork" for an answer that forks (run before any thread starts), "background" for one that waits on
something else (run in a thread meanwhile), else "inline". Prints one JSON list, in the order asked:

    [["root "], ["0, NVIDIA B200, 183359, 10.0, 580.95.05, Enabled, Disabled"], null, ...]
"""

import importlib
import json
import sys
import threading

import host_facts


def answer(function: str, args: dict):
    module, _, name = function.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)(args)
    except Exception:  # not answered exactly here: the fact's own command says what it says
        return None


def main(requests: list) -> list:
    for _, args, function, _ in requests:
        host_facts.ASKED.setdefault(function, []).append(args)
    answers: list = [None] * len(requests)
    for stage in ("fork", "background", "inline"):
        threads = []
        for i, (_, args, function, how) in enumerate(requests):
            if how != stage:
                continue
            if how == "background":
                threads.append(threading.Thread(target=lambda i=i, f=function, a=args: answers.__setitem__(
                    i, answer(f, a))))
                threads[-1].start()
            else:
                answers[i] = answer(function, args)
        if stage == "background":
            background = threads
    for thread in background:
        thread.join()
    return answers


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))

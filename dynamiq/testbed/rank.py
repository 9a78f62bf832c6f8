"""One rank of a testbed world: the program :mod:`dynamiq.testbed.world` starts inside a rank's
network namespace (``ip netns exec NS python -c ... JOBDIR RANK``).

It reads from ``JOBDIR`` what the parent left there (``prepare.pkl``: the parent's
``sys.path``, working directory and main module, as ``multiprocessing``'s spawn start method
passes them; ``job.pkl``: the function, its arguments and the group's rendezvous), joins the
gloo group at rank 0's namespace address, calls the function and writes ``result-<rank>.pkl``:
``("ok", pickled value)`` or ``("error", traceback, time of the failure)``, written to a
temporary name and renamed, so the parent never reads half a report.

Nothing here knows it runs in a namespace: given another host's address the same code joins
a group across machines.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
import traceback

__all__ = ["main", "report"]


def report(jobdir: str, rank: int, message: tuple) -> None:
    """Write rank ``rank``'s report into ``jobdir`` atomically."""
    path = os.path.join(jobdir, f"result-{rank}.pkl")
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(message, f)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Run the rank described by ``argv = [JOBDIR, RANK]`` (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 when a report was written (the function's failure included), 1 when
        not even that worked.
    """
    jobdir, rank = (argv if argv is not None else sys.argv[1:])[:2]
    rank = int(rank)
    message = None
    try:
        from multiprocessing.spawn import prepare

        with open(os.path.join(jobdir, "prepare.pkl"), "rb") as f:
            prepare(pickle.load(f))
        with open(os.path.join(jobdir, "job.pkl"), "rb") as f:
            job = pickle.load(f)

        import torch

        from dynamiq.collectives.launch import joined_group

        if job["num_threads"] is not None:
            torch.set_num_threads(job["num_threads"])
        with joined_group(rank, job["world_size"], job["port"], backend="gloo",
                          timeout=job["group_timeout"], host=job["host"]):
            try:
                value = job["fn"](rank, job["world_size"], *job["args"])
            except Exception:
                # before the group goes: the cause should reach the parent before the other
                # ranks fail in consequence
                message = ("error", traceback.format_exc(), time.monotonic())
                report(jobdir, rank, message)
                raise
        message = ("ok", pickle.dumps(value))
    except BaseException:
        if message is not None:
            return 0
        message = ("error", traceback.format_exc(), time.monotonic())
    try:
        report(jobdir, rank, message)
    except Exception:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""One rank of a torchrun-style job, for tests/reliability/test_ranks.py (no torch needed).

    RANK=r WORLD_SIZE=n MASTER_PORT=p python rank_worker.py RUN_DIR SLOW_RANK SLOW_S BASE_S STEPS [outside]

Each step: ``compute`` sleeps BASE_S (SLOW_S on SLOW_RANK; -1: no slow rank; with ``outside``
the slow rank's extra time is spent before ``compute``, in no stage), then
``allreduce`` is a real synchronisation over TCP: rank 0 waits for one byte from every other
rank, then answers each, so every rank leaves it when the last one has arrived, as in a
collective. The session is the real one; each rank writes its own part of RUN_DIR.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import maxinstr


def connect(rank: int, world: int, port: int) -> list[socket.socket]:
    if rank == 0:
        srv = socket.create_server(("127.0.0.1", port))
        srv.settimeout(60)
        conns = [srv.accept()[0] for _ in range(world - 1)]
        srv.close()
        return conns
    deadline = time.monotonic() + 60
    while True:
        try:
            return [socket.create_connection(("127.0.0.1", port), timeout=60)]
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def allreduce(rank: int, conns: list[socket.socket]) -> None:
    if rank == 0:
        for c in conns:
            if c.recv(1) != b"x":
                raise RuntimeError("peer left")
        for c in conns:
            c.sendall(b"x")
    else:
        conns[0].sendall(b"x")
        if conns[0].recv(1) != b"x":
            raise RuntimeError("rank 0 left")


def main() -> None:
    run_dir, slow_rank, slow_s, base_s, steps = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    outside = sys.argv[6:7] == ["outside"]
    rank, world, port = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["MASTER_PORT"])
    conns = connect(rank, world, port)
    with maxinstr.session(run_dir, sample_hz=0, warmup=1):
        allreduce(rank, conns)  # start the steps together
        for i in range(steps):
            if outside and rank == slow_rank:
                time.sleep(slow_s - base_s)  # unstaged work: only the arrival at allreduce shows it
            with maxinstr.stage("step", step=i):
                with maxinstr.stage("compute", step=i):
                    time.sleep(base_s if outside or rank != slow_rank else slow_s)
                with maxinstr.stage("allreduce", step=i):
                    allreduce(rank, conns)
    for c in conns:
        c.close()


if __name__ == "__main__":
    main()

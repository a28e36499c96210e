"""Request ids from the pooled random bytes: the shape of uuid4().hex, unique, not shared with a fork."""
from __future__ import annotations

import os

from cache_core.ids import IdPool, new_id


def test_ids_are_32_hex_characters_and_unique_across_refills():
    pool = IdPool(per_read=4)
    ids = [pool.take() for _ in range(1000)]
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert len(set(ids)) == len(ids)
    assert len(new_id()) == 32 and new_id() != new_id()


def test_a_forked_child_draws_its_own_ids():
    pool = IdPool()
    pool.take()  # the parent now holds 255 unused ids
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report its next id and leave at once
        os.write(write, pool.take().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    assert child != pool.take()
    assert child not in {pool.take() for _ in range(300)}

"""READDIR pinned to the directory a listing began in (session 16): a listing crosses many
pages, each a READDIR by path after a cursor; when the path leads to another directory by the
next page (renamed away, another made under its name), meta answers ENOENT instead of that
directory's names. The mount lists an open directory this way (its inode is the kernel's), and
the client's paged listings pin the first page's directory."""

from __future__ import annotations

import errno
from collections.abc import Iterator

import pytest
from test_meta_namespace import Env


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env()
    yield e
    e.close()


def test_a_page_of_another_directory_under_the_same_path_is_enoent(env: Env) -> None:
    env.run(env.ns.mkdir("/d"))
    for n in ("a", "b", "c"):
        env.create(f"/d/{n}")
    page, more, dir_inode = env.run(env.ns.readdir_in("/d", limit=2))
    assert [e.name for e in page] == ["a", "b"] and more
    assert dir_inode == env.run(env.ns.stat("/d")).inode
    env.run(env.ns.rename("/d", "/moved"))
    env.run(env.ns.mkdir("/d"))
    env.create("/d/zz")  # sorts after the cursor: the old code listed it as the first directory's
    assert env.err(env.ns.readdir_in("/d", after="b", dir_inode=dir_inode)) == errno.ENOENT
    page, more, _ = env.run(env.ns.readdir_in("/moved", after="b", dir_inode=dir_inode))
    assert [e.name for e in page] == ["c"] and not more  # the same directory by its new name
    page, more, other = env.run(env.ns.readdir_in("/d", after="b"))  # unpinned: whichever is there
    assert [e.name for e in page] == ["zz"] and other != dir_inode


def test_a_pinned_page_of_a_path_that_is_a_file_now_is_enoent(env: Env) -> None:
    env.run(env.ns.mkdir("/d"))
    env.create("/d/a")
    _, _, dir_inode = env.run(env.ns.readdir_in("/d", limit=1))
    env.run(env.ns.rename("/d", "/moved"))
    env.create("/d")
    assert env.err(env.ns.readdir_in("/d", after="a", dir_inode=dir_inode)) == errno.ENOENT
    assert env.err(env.ns.readdir_in("/d", after="a")) == errno.ENOTDIR  # unpinned, as before


def test_the_clients_paged_listing_stays_in_the_directory_it_began_in() -> None:
    """``AsyncClient.readdir_pages`` (``ls``, ``scandir``, fsspec's listings) pins its first
    page's directory: the old code went on by path with the new directory's names."""
    import asyncio

    from test_client_support import make_client

    async def main() -> None:
        client, meta, _ = make_client()
        await meta.mkdir("/d", 0o755, False, False)
        for n in ("a", "b", "c", "d"):
            await meta.mkdir(f"/d/{n}", 0o755, False, False)
        pages = client.readdir_pages("/d")
        first = await pages.__anext__()  # the fake's pages hold 2 names
        assert [e.name for e in first] == ["a", "b"]
        for p in [p for p in meta.nodes if p == "/d" or p.startswith("/d/")]:
            del meta.nodes[p]  # another client: mv d elsewhere
        await meta.mkdir("/d", 0o755, False, False)  # and mkdir d
        await meta.mkdir("/d/zz", 0o755, False, False)
        with pytest.raises(FileNotFoundError):
            await pages.__anext__()

    asyncio.run(main())

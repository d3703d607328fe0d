"""XattrProbes: a setxattr's create/replace flag recovered from pyfuse3's getxattr check."""

from __future__ import annotations

import os

from loomfs.mount.xattrs import XattrProbes


class Ctx:  # pyfuse3.RequestContext: one object per request
    pass


def test_flag_follows_the_check_of_the_same_request() -> None:
    p = XattrProbes()
    create, replace, plain, other = Ctx(), Ctx(), Ctx(), Ctx()
    p.seen(create, 5, b"user.a", present=False)
    p.seen(replace, 5, b"user.a", present=True)
    p.seen(other, 5, b"user.a", present=False)  # an ordinary getxattr request
    assert p.flags_for(create, 5, b"user.a") == os.XATTR_CREATE
    assert p.flags_for(replace, 5, b"user.a") == os.XATTR_REPLACE
    assert p.flags_for(plain, 5, b"user.a") == 0  # no check before it: no flag
    assert p.flags_for(create, 5, b"user.a") == 0  # used once
    p.seen(plain, 5, b"user.a", present=False)
    assert p.flags_for(plain, 6, b"user.a") == 0  # another inode or name: not its check
    p.seen(plain, 5, b"user.a", present=False)
    assert p.flags_for(plain, 5, b"user.b") == 0
    assert p.flags_for(None, 5, b"user.a") == 0
    assert len(p) == 1  # 'other' ages out, never matched


def test_bounded() -> None:
    p = XattrProbes(kept=3)
    ctxs = [Ctx() for _ in range(5)]
    for c in ctxs:
        p.seen(c, 1, b"user.x", present=False)
    assert len(p) == 3
    assert p.flags_for(ctxs[0], 1, b"user.x") == 0  # the oldest went
    assert p.flags_for(ctxs[4], 1, b"user.x") == os.XATTR_CREATE

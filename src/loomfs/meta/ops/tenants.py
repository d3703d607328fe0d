"""Tenant roots (``loomfs.meta.tenancy``): an administrator creates a tenant's root directory;
the tenant's tokens then see it as "/"."""

from __future__ import annotations

import dataclasses

from loomfs.errors import StatusError
from loomfs.meta import tenancy
from loomfs.meta.ops.base import C_DIRS, DIR, NamespaceBase
from loomfs.wire.status import Status
from loomfs.wire.types import Attr


@dataclasses.dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    number: int
    root: Attr | None  # None in listings that did not ask for it


class TenantOps(NamespaceBase):
    async def create_tenant(self, name: str, *, uid: int = 0, gid: int = 0, mode: int = 0o755) -> Tenant:
        """A new tenant ``name`` with an empty root directory owned by ``uid``:``gid`` (EEXIST if
        it exists; ENOSPC past ``TENANT_MAX`` tenants). The caller's rights (ADMIN) are the RPC
        layer's to check."""
        tenancy.check_name(name)
        if not (0 <= uid < 1 << 32 and 0 <= gid < 1 << 32):
            raise StatusError(Status.EINVAL, f"uid {uid} / gid {gid}")
        async with self.store.write() as txn:
            if await txn.state_get(tenancy.TENANT_KEY + name) is not None:
                raise StatusError(Status.EEXIST, f"tenant {name!r} exists")
            number = await txn.next_id(tenancy.TENANT_COUNTER)
            if number > tenancy.TENANT_MAX:
                raise StatusError(Status.ENOSPC, f"at most {tenancy.TENANT_MAX} tenants")
            now = self.clock.now_ns()
            root = Attr(
                inode=tenancy.root_of(number), type=DIR, mode=mode & 0o7777, nlink=2, uid=uid, gid=gid,
                atime_ns=now, mtime_ns=now, ctime_ns=now, layout=dataclasses.replace(self.default_layout, chains=[]),
            )
            await txn.put_inode(root)
            await txn.add_counter(tenancy.counter_of(number), root.inode & ((1 << tenancy.TENANT_SHIFT) - 1))
            await txn.add_counter(C_DIRS, 1)
            await txn.state_put(tenancy.TENANT_KEY + name, str(number).encode())
        return Tenant(name, number, root)

    async def list_tenants(self) -> list[Tenant]:
        async with self.store.read() as txn:
            rows = await txn.state_list(tenancy.TENANT_KEY)
            out = []
            for key, raw in rows:
                number = int(raw)
                out.append(Tenant(key[len(tenancy.TENANT_KEY):], number, await txn.get_inode(tenancy.root_of(number))))
        return sorted(out, key=lambda t: t.number)

"""A throw-away CA and a server certificate for 127.0.0.1 (TLS tests and benchmarks), made with
the ``openssl`` command (docs/security.md shows the same steps for a real cluster)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CertSet:
    ca_file: str
    cert_file: str
    key_file: str


def openssl_available() -> bool:
    return shutil.which("openssl") is not None


def make_cert_set(directory: str | Path, ip: str = "127.0.0.1") -> CertSet:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    ca_key, ca, key, csr, cert = (str(d / n) for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    ext = d / "san.ext"
    ext.write_text(f"subjectAltName=IP:{ip}\n")
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", ca_key,
        "-out", ca, "-days", "2", "-subj", "/CN=loomfs-test-ca")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", csr,
        "-subj", f"/CN={ip}")
    run("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "2",
        "-extfile", str(ext))
    for p in (ca_key, key):
        Path(p).chmod(0o600)
    return CertSet(ca, cert, key)

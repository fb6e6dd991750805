"""Certificates and keys for a local control plane, made with the ``openssl`` CLI (installed with
``apt-get`` when it is missing, as on a fresh CI machine)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from devtools.processes import ProcessError

# P-256 keys for the CA and TLS certificates: generated in milliseconds, where RSA takes a second or
# more on a busy machine. The service-account signing key stays RSA (RS256, what clients expect).
EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")


class PkiError(ProcessError):
    """openssl is missing and cannot be installed, or one of its commands failed."""


def _ensure_openssl() -> str:
    """Path of the openssl CLI, installed with apt when missing (the PKI needs it)."""
    found = shutil.which("openssl")
    if found:
        return found
    if shutil.which("apt-get") is None:
        raise PkiError("the openssl command is missing and apt-get is not available")
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "openssl"]):
        if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
            raise PkiError(f"openssl is missing and `{' '.join(cmd)}` failed: install openssl")
    found = shutil.which("openssl")
    if not found:
        raise PkiError("apt-get installed openssl but it is still not on PATH")
    return found


class Pki:
    """Certificates and keys for one control plane, made with the openssl CLI."""

    def __init__(self, directory: Path, service_ip: str) -> None:
        self.dir = directory
        self.service_ip = service_ip  # the `kubernetes` Service's ClusterIP: in the serving cert
        self.ca_crt = directory / "ca.crt"
        self.ca_key = directory / "ca.key"
        self.serving_crt = directory / "apiserver.crt"
        self.serving_key = directory / "apiserver.key"
        self.admin_crt = directory / "admin.crt"
        self.admin_key = directory / "admin.key"
        self.sa_key = directory / "sa.key"
        self.sa_pub = directory / "sa.pub"

    def generate(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        openssl = _ensure_openssl()
        run = self._runner(openssl)
        run(
            "req",
            "-x509",
            *EC_KEY,
            "-nodes",
            "-days",
            "3650",
            "-subj",
            "/CN=kompile-dev-ca",
            "-keyout",
            self.ca_key,
            "-out",
            self.ca_crt,
        )
        sans = f"IP:127.0.0.1,DNS:localhost,IP:{self.service_ip},DNS:kubernetes,DNS:kubernetes.default.svc"
        serving = f"subjectAltName={sans}\nextendedKeyUsage=serverAuth"
        self._leaf(run, "apiserver", "/CN=kube-apiserver", serving)
        # O=system:masters: the admin client (and the controllers sharing its kubeconfig) may do anything.
        self._leaf(run, "admin", "/O=system:masters/CN=kompile-admin", "extendedKeyUsage=clientAuth")
        run("genrsa", "-out", self.sa_key, "2048")
        run("rsa", "-in", self.sa_key, "-pubout", "-out", self.sa_pub)

    def _leaf(self, run: Callable[..., None], name: str, subject: str, extensions: str) -> None:
        """A key and a certificate signed by the CA, with the given X.509 v3 extensions."""
        key, csr, crt = (self.dir / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
        ext_file = self.dir / f"{name}.ext"
        ext_file.write_text(extensions + "\n")
        run("req", *EC_KEY, "-nodes", "-subj", subject, "-keyout", key, "-out", csr)
        run(
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            self.ca_crt,
            "-CAkey",
            self.ca_key,
            "-CAcreateserial",
            "-days",
            "365",
            "-extfile",
            ext_file,
            "-out",
            crt,
        )

    def _runner(self, openssl: str) -> Callable[..., None]:
        def run(*args: str | Path) -> None:
            result = subprocess.run([openssl, *map(str, args)], capture_output=True, text=True)
            if result.returncode != 0:
                raise PkiError(f"openssl {args[0]} failed: {result.stderr.strip()}")

        return run

"""Debian's OpenSSH server on a loopback port, as a test's own SFTP server.

Its own configuration, host key and authorized key in a temporary directory;
public-key login only, for the user running the tests; `internal-sftp` serves
the files. `ssh_command` is the client command restic runs through
`-o sftp.command=...` (host key pinned, no agent, no user configuration).
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from servers import free_port, require_binary, stop


@dataclass
class Sshd:
    port: int
    user: str
    ssh_command: str

    def repository(self, path: Path) -> str:
        return f"sftp:{self.user}@127.0.0.1:{path}"


def _wait_for_banner(port: int, process: subprocess.Popen, log: Path, deadline_s: float = 30) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                if sock.recv(64).startswith(b"SSH-2.0"):
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"sshd not up on port {port} after {deadline_s}s: {log.read_text()[-2000:]}")


@contextmanager
def sshd(root: Path) -> Iterator[Sshd]:
    """Start sshd on a free loopback port with everything under root."""
    binary = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
    if binary is None:
        require_binary("sshd")  # skips (fails under CI=true): Debian package openssh-server
    keygen = require_binary("ssh-keygen")
    ssh = require_binary("ssh")
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    for name in ("host_key", "client_key"):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)], check=True, timeout=60)
    (root / "authorized_keys").write_text((root / "client_key.pub").read_text())
    os.chmod(root / "authorized_keys", 0o600)
    port = free_port()
    host_key = (root / "host_key.pub").read_text().split()
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n")
    config = root / "sshd_config"
    config.write_text(
        f"""Port {port}
ListenAddress 127.0.0.1
HostKey {root}/host_key
PidFile {root}/sshd.pid
AuthorizedKeysFile {root}/authorized_keys
AuthenticationMethods publickey
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
X11Forwarding no
AllowTcpForwarding no
Subsystem sftp internal-sftp
"""
    )
    if os.getuid() == 0:
        # sshd started as root checks its privilege separation directory (Debian's is /run/sshd).
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = root / "sshd.log"
    with log.open("wb") as out:
        process = subprocess.Popen([binary, "-D", "-e", "-f", str(config)], stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for_banner(port, process, log)
        command = (
            f"{ssh} -F /dev/null -p {port} -i {root}/client_key -o IdentitiesOnly=yes -o BatchMode=yes"
            f" -o StrictHostKeyChecking=yes -o UserKnownHostsFile={root}/known_hosts"
            f" {getpass.getuser()}@127.0.0.1 -s sftp"
        )
        yield Sshd(port=port, user=getpass.getuser(), ssh_command=command)
    finally:
        stop(process)

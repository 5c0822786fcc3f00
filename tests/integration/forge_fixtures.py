"""Shared helpers for the build engine's integration tests (export, check-patches, faults, housekeeping).

* :func:`tiny_base` -- a ~200 MB base image with python3 and a fake ``vllm`` distribution, made from the cpu
  recipe's OS image without its toolchain (one layer, made once) in a second: builds on it take a few seconds.
* :func:`write_manifest` -- a manifest in a tmp dir with a unique target (isolated labels,
  tags and cache keys from every other test on the shared daemon).
* :class:`SocketProxy` -- a unix-socket proxy to the real daemon that a test can cut (the
  daemon "goes away" for the build without anything happening to the daemon) or that
  answers chosen requests with an error (disk full).
* :class:`SecondDaemon` -- a clean dockerd with its own data root, exec root, pid file,
  socket and bridge (no iptables: the shared daemon's rules stay untouched).
* :class:`Registry` -- Debian's ``docker-registry`` on 127.0.0.1:<free port>, own storage.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import docker

from tests.cli import imageforge
from tests.integration import helpers

REPO = Path(__file__).resolve().parents[2]
INVOKE = REPO / ".venv" / "bin" / "invoke"
TEST_LABEL = "org.imageforge.test"
SITE = "/usr/local/lib/python3.11/dist-packages"

ATTN = '''\
"""A stand-in for a vLLM module that patches target."""

BLOCK = 128 if True else 64
NUM_WARPS = 8


def attention(q, k):
    return q


def other(q, k):
    return q
'''


client = helpers.sdk  # a plain SDK client of the local daemon, or of ``host``


def read_from_image(image: str, path: str) -> bytes:
    """The bytes of one file of ``image`` (a created, never started container; removed again)."""
    container = client().containers.create(image, entrypoint=["/bin/true"], command=[])
    try:
        stream, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            assert member is not None
            fh = tar.extractfile(member)
            assert fh is not None
            return fh.read()
    finally:
        container.remove(force=True)


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 1577836800
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _os_image(c: docker.DockerClient) -> Any:
    """The cpu recipe's OS image (or its vLLM base) by computed tag, never by an inheritable label."""
    return helpers.os_image(c, or_vllm_base=True)


# the OS image's toolchain stage (images/cpu/base.yaml): the box's native build needs it, no tiny target does
TOOLCHAIN_OUT = "apt-mark auto g++ python3-dev >/dev/null && apt-get -y -qq autoremove --purge >/dev/null"


def _lean_os(c: docker.DockerClient) -> str:
    """The cpu recipe's OS image without its toolchain stage, flattened into one layer (made when missing): ~200 MB
    where the OS image is 447 MB, so a tiny image's export, push and copy to a second daemon carry half the bytes."""
    os_image = _os_image(c)
    short = os_image.id.split(":")[-1][:12]
    ref = f"imageforge-test/lean-os:{short}"
    with helpers.one_maker(f"lean-os-{short}"):
        with contextlib.suppress(docker.errors.ImageNotFound):
            c.images.get(ref)
            return ref
        container = c.containers.create(os_image.id, command=["sh", "-c", TOOLCHAIN_OUT], network_disabled=True,
                                        labels={TEST_LABEL: "lean-os"})
        try:
            container.start()
            assert container.wait(timeout=300)["StatusCode"] == 0, container.logs().decode(errors="replace")
            config = os_image.attrs["Config"]
            changes = [f"ENV {e}" for e in config.get("Env") or []] + [f"CMD {json.dumps(config.get('Cmd') or [])}"]
            repo, tag = ref.split(":")
            c.api.import_image(src=container.export(), repository=repo, tag=tag, changes=changes, stream_src=True)
        finally:
            container.remove(force=True)
    return ref


def tiny_base(c: docker.DockerClient | None = None, *, unique: bool = False) -> str:
    """Reference of the tiny base (made when missing); ``unique``: a fresh copy no other image builds on."""
    c = c or client()
    files = {
        f"{SITE}/vllm/__init__.py": b"__version__ = '1.0'\n",
        f"{SITE}/vllm/ops/__init__.py": b"",
        f"{SITE}/vllm/ops/attn.py": ATTN.encode(),
        f"{SITE}/vllm-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: vllm\nVersion: 1.0\n",
        f"{SITE}/vllm-1.0.dist-info/RECORD": b"",
    }
    os_image = c.images.get(_lean_os(c))
    digest = hashlib.sha256(json.dumps({k: v.decode() for k, v in files.items()}, sort_keys=True).encode()
                            + os_image.id.encode()).hexdigest()[:12]
    ref = f"imageforge-test/tinybase:{digest}"
    if unique:
        files["/etc/imageforge-test-unique"] = secrets.token_hex(8).encode()
        return _commit_tiny_base(c, os_image, files, f"imageforge-test/tinybase:{digest}-{secrets.token_hex(3)}")
    with helpers.one_maker(f"tinybase-{digest}"):
        with contextlib.suppress(docker.errors.ImageNotFound):
            c.images.get(ref)
            return ref
        return _commit_tiny_base(c, os_image, files, ref)


def _commit_tiny_base(c: docker.DockerClient, os_image: Any, files: dict[str, bytes], ref: str) -> str:
    container = c.containers.create(os_image.id, command=["true"])
    try:
        container.put_archive("/", _tar(files))
        repo, tag = ref.split(":")
        container.commit(repository=repo, tag=tag, conf={
            "Cmd": ["python3", "-c", "print('tiny base')"],
            "Labels": {"org.imageforge.tool": "imageforge-test", TEST_LABEL: "tinybase",
                       "org.imageforge.kind": "test-base"}})
    finally:
        container.remove(force=True)
    return ref


_targets: set[str] = set()


def _drop_test_images() -> None:
    """At exit: every image and container of the targets this process made (on the shared daemon).

    One listing of the daemon's images per round, not one per target: with a few hundred images on a daemon a
    listing costs ~0.15 s of its CPU, and a worker makes dozens of targets."""
    with contextlib.suppress(Exception):
        c = client()
        label = "org.imageforge.target"
        for ct in c.containers.list(all=True, ignore_removed=True, filters={"label": label}):
            if ct.labels.get(label) in _targets:
                with contextlib.suppress(docker.errors.APIError):
                    ct.remove(force=True)
        for _ in range(10):  # children before parents (newest first); tags removed with the image
            images = [raw for raw in c.api.images(all=True, filters={"label": label})
                      if (raw.get("Labels") or {}).get(label) in _targets]
            if not images:
                break
            for raw in sorted(images, key=lambda i: -int(i.get("Created") or 0)):
                with contextlib.suppress(docker.errors.APIError):
                    c.api.remove_image(raw["Id"], force=True, noprune=True)


def write_manifest(root: Path, base: str, *, target: str | None = None, steps: str | None = None,
                   profiles: str | None = None, files: dict[str, str] | None = None,
                   command: str = "[python3, -m, http.server]") -> tuple[Path, str]:
    """A manifest with one target on ``base``; returns (path, target name).  The target's images
    are removed when the test process exits. ``command``: its serving command (YAML flow list)."""
    target = target or f"t{secrets.token_hex(3)}"
    _targets.add(target)
    root.mkdir(parents=True, exist_ok=True)
    default_files = {
        "overlays/extra.py": f"EXTRA = {secrets.randbelow(10**9)}\n",
        "scripts/ok.sh": "#!/bin/sh\necho script-ran \"$@\"\n",
    }
    for rel, text in {**default_files, **(files or {})}.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        if rel.endswith(".sh"):
            p.chmod(0o755)
    if steps is None:
        # the overlay (random content) first: every manifest gets its own cache chain, so tests that
        # remove images (clean, faults) never touch a layer another test's build reuses
        steps = """\
          - id: extra
            kind: overlay
            source: overlays/extra.py
            dest: vllm/ops/extra.py
          - id: warps
            kind: patch
            file: vllm/ops/attn.py
            old: "NUM_WARPS = 8"
            new: "NUM_WARPS = 4"
          - id: script
            kind: script
            source: scripts/ok.sh
            args: [hello]
"""
    if profiles is None:
        profiles = """\
          small: {args: {max-num-seqs: 2}}
          big: {extends: small, args: {max-num-seqs: 8}}
"""
    doc = f"""\
version: 1
default_target: {target}
targets:
  {target}:
    base: {{image: "{base}"}}
    package: {{import: vllm, distribution: vllm, version: "1.0", flags: off}}  # the tiny base has no vLLM parser
    image: imageforge-test/{target}
    run:
      port: 8000
    steps:
{textwrap.indent(textwrap.dedent(steps), "      ")}
    verify:
      imports: [vllm.ops.attn, vllm.ops.extra]
    serving:
      config_path: /etc/imageforge/serving.yaml
      command: {command}
      args: {{model: /m, max-num-seqs: 1}}
    default_profile: small
    profiles:
{textwrap.indent(textwrap.dedent(profiles), "      ")}
"""
    path = root / "build.yaml"
    path.write_text(doc)
    return path, target


def invoke(*args: str, env: dict[str, str] | None = None, timeout: float = 600, check: bool = False,
           process: bool = False) -> subprocess.CompletedProcess[str]:
    """``imageforge ARGS`` as a user runs it from the repo root (:func:`tests.cli.imageforge`: in this process unless
    ``process``), output captured, without IMAGEFORGE_TRACEBACK (the tests read what a user reads)."""
    return imageforge(*args, expect=0 if check else None, timeout=timeout, process=process,
                      env={"IMAGEFORGE_TRACEBACK": None, **(env or {})})


def assert_clean_failure(proc: subprocess.CompletedProcess[str], code: int) -> None:
    """The exit code is ``code`` and no Python traceback reached the user."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, f"exit {proc.returncode}, wanted {code}\n{out}"
    assert "Traceback (most recent call last)" not in out, out


def run_id_of(output: str) -> str | None:
    m = re.search(r"\brun (\d{8}-\d{6}-[0-9a-f]{4})\b", output)
    return m.group(1) if m else None


def settles(condition: Callable[[], bool], timeout: float = 300) -> bool:
    """``condition`` holds, now or within ``timeout`` s: for a check over the whole daemon (no container or image of a
    kind left behind), which a build or a server of the other worker of ``invoke test`` may make true only once it
    has finished with its own; what a test leaked stays, and the check fails."""
    from imageforge.serve.waits import wait_until

    return wait_until(lambda: True if condition() else None, timeout=timeout, interval=1.0) is True


def build_containers(c: docker.DockerClient | None = None) -> set[str]:
    """IDs of imageforge's labelled containers other than servers: what a build or a dry run may leave behind.

    Servers (kind ``server``) are left out: the session's shared server, or another test's, may start or stop
    while the step under test runs, and none of them is the step's to remove.
    """
    return {x.id for x in helpers.labelled(c=c) if x.labels.get("org.imageforge.kind") != "server"}


def remove_images(c: docker.DockerClient, refs: Sequence[str]) -> None:
    for ref in refs:
        with contextlib.suppress(docker.errors.APIError):
            c.images.remove(ref, force=True, noprune=False)


free_port = helpers.free_port


# --------------------------------------------------------------------------- socket proxy


class SocketProxy:
    """unix socket -> the daemon's socket, byte for byte; ``cut()`` drops everything at once.

    ``fail`` holds (METHOD, path regex, status, message) rules: a matching request is answered
    by the proxy with that error, never reaching the daemon (HTTP/1.1 requests with a
    Content-Length body; an upgraded or chunked connection is passed through untouched).
    """

    def __init__(self, directory: Path, upstream: str = "/var/run/docker.sock") -> None:
        self.path = directory / "proxy.sock"
        self.upstream = upstream
        self.fail: list[tuple[str, str, int, str]] = []
        self.seen: list[str] = []
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self.path))
        self._server.listen(64)
        self._cut = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def host(self) -> str:
        return f"unix://{self.path}"

    def _accept(self) -> None:
        while not self._cut:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                up.connect(self.upstream)
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._conns += [conn, up]
            threading.Thread(target=self._client_to_daemon, args=(conn, up), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, conn), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _client_to_daemon(self, conn: socket.socket, up: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        raise OSError("client closed")
                    buf += data
                head, _, rest = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target = lines[0].split(" ")[:2]
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
                self.seen.append(f"{method} {target}")
                if "upgrade" in headers.get("connection", "").lower() or "chunked" in headers.get(
                        "transfer-encoding", ""):
                    up.sendall(buf)
                    self._pump(conn, up)  # raw from here on
                    return
                length = int(headers.get("content-length", "0") or 0)
                while len(rest) < length:
                    data = conn.recv(65536)
                    if not data:
                        raise OSError("client closed")
                    rest += data
                body, buf = rest[:length], rest[length:]
                rule = next((r for r in self.fail if r[0] == method and re.search(r[1], target)), None)
                if rule is not None:
                    payload = json.dumps({"message": rule[3]}).encode()
                    conn.sendall(f"HTTP/1.1 {rule[2]} Injected\r\nContent-Type: application/json\r\n"
                                 f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
                    continue
                up.sendall(head + b"\r\n\r\n" + body)
        except (OSError, ValueError):
            pass
        finally:
            for s in (conn, up):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """The daemon is gone: no new connections, every open one dropped."""
        self._cut = True
        with contextlib.suppress(OSError):
            self._server.close()
        with contextlib.suppress(OSError):
            self.path.unlink()
        with self._lock:
            for s in self._conns:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()


# --------------------------------------------------------------------------- a second daemon


class SecondDaemon:
    """A clean dockerd of its own (data root, exec root, pid file, socket, bridge) in a tmp dir."""

    def __init__(self) -> None:
        self.dir = helpers.scratch_dir("ifd2-", needs=4 * helpers.GIB)  # the export loads the 2.9 GB cpu image
        self.socket = self.dir / "docker.sock"
        self.bridge = f"ifbr{secrets.token_hex(2)}"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout: float = 60) -> SecondDaemon:
        octet = 200 + secrets.randbelow(50)
        subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", f"10.{octet}.{secrets.randbelow(250)}.1/24", "dev", self.bridge],
                       check=True)
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True)
        (self.dir / "daemon.json").write_text("{}")
        log = open(self.dir / "dockerd.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            ["dockerd", "--config-file", str(self.dir / "daemon.json"), "--data-root", str(self.dir / "data"),
             "--exec-root", str(self.dir / "exec"), "--pidfile", str(self.dir / "docker.pid"),
             "-H", self.host, "--bridge", self.bridge, "--iptables=false", "--ip-masq=false",
             "--ip6tables=false"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                client(self.host).ping()
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.3)
        self.stop()
        raise RuntimeError("the second dockerd did not start: " + (self.dir / "dockerd.log").read_text()[-2000:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(Exception):
                c = client(self.host)
                for ct in c.containers.list(all=True, ignore_removed=True):
                    ct.remove(force=True)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        out = subprocess.run(["mount"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split(" ")
            if len(parts) > 2 and parts[2].startswith(str(self.dir)):
                subprocess.run(["umount", "-l", parts[2]], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


_second: SecondDaemon | None = None


def second_daemon() -> SecondDaemon:
    """One second daemon per test process (started on first use, stopped by :func:`session_cleanup`)."""
    global _second
    if _second is None:
        _second = SecondDaemon().start()
    return _second


def session_cleanup() -> None:
    """What this module made for the test process: the test targets' images and containers, the second daemon.
    Called at the session's end (tests/integration/conftest.py), not at interpreter exit: xdist gives a worker 10 s
    to exit before it kills it, and coverage saves a process's data last among the exit handlers."""
    global _second
    _drop_test_images()
    if _second is not None:
        _second.stop()
        _second = None


def copy_image(ref: str, to_host: str) -> None:
    """`docker save REF | DOCKER_HOST=to docker load` through the SDK."""
    src = client().api.get_image(ref)
    client(to_host).api.load_image(b"".join(src))


# --------------------------------------------------------------------------- local registry


class Registry:
    """docker-registry (Debian) on 127.0.0.1:<free port> with its own storage; no auth, no TLS."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ifreg-", dir="/tmp"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> Registry:
        exe = shutil.which("docker-registry")
        if exe is None:
            from imageforge.docker_engine import apt_install

            apt_install(["docker-registry"])
            exe = shutil.which("docker-registry") or "/usr/bin/docker-registry"
        config = self.dir / "config.yml"
        config.write_text(textwrap.dedent(f"""\
            version: 0.1
            log: {{level: warn}}
            storage:
              filesystem: {{rootdirectory: {self.dir / 'data'}}}
              delete: {{enabled: true}}
            http:
              addr: 127.0.0.1:{self.port}
        """))
        log = open(self.dir / "registry.log", "wb")
        self.proc = subprocess.Popen([exe, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        import httpx

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://{self.address}/v2/", timeout=2).status_code == 200:
                    return self
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError("docker-registry did not start")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def tmp_dir(prefix: str) -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)

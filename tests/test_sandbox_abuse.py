"""The abuse suite: hostile actions against both backends. Each must be contained (the host is
untouched), recorded in the ledger where it is observable, leave the harness alive and leave no
process behind, and the next reset() must give the pristine hash."""

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from toolgym.sandbox import EffectKind as K

HOST_SECRET = Path(tempfile.gettempdir()) / "tg-abuse-host-secret.txt"
HOST_TEXT = "host secret: never visible inside a sandbox\n"
os.environ["TG_HOST_MARKER"] = "tg-host-env-marker-5f1c"


@dataclass
class Attack:
    name: str
    cmd: str
    expect: set = field(default_factory=set)  # every kind must be recorded
    any_of: set = field(default_factory=set)  # at least one of these kinds
    check: Callable | None = None  # extra assertion on (result, sandbox)
    timeout: float = 10


def no_secret(r, box):
    assert "host secret" not in r.stdout + r.stderr


def no_root_shadow(r, box):
    assert "root:" not in r.stdout


def no_host_env(r, box):
    assert "tg-host-env-marker" not in r.stdout


def survived(r, box):
    assert "survived" in r.stdout or r.exit_code != 0


def small_file(r, box):
    size = int(box.exec("stat -c %s big 2>/dev/null || echo 0").stdout.strip() or 0)
    assert size <= 17 * 1024 * 1024


def disk_stopped(r, box):
    """Many files under the per-file limit: the disk limit (48 MiB) stops the command midway."""
    assert r.limit_hit == "disk" and "done" not in r.stdout
    assert box.written_bytes() < 120 * 1024 * 1024


def quick_kill(r, box):
    assert r.duration_s < 15 and (r.truncated or r.limit_hit == "output")


def memory_contained(r, box):
    assert r.exit_code != 0 and (r.oom_killed or "MemoryError" in r.stderr)


ATTACKS = [
    Attack("read host file", "cat $HS; ls /root /home /work 2>&1", check=no_secret),
    Attack("write host file", "echo pwned > $HS; cat $HS"),
    Attack("read shadow", "cat /etc/shadow 2>&1", check=no_root_shadow),
    Attack("append to /etc/passwd", "echo 'evil:x:0:0::/:/bin/sh' >> /etc/passwd", expect={K.WRITE_OUTSIDE_WORKSPACE}),
    Attack("write into /usr/bin", "echo evil > /usr/bin/evil", expect={K.WRITE_OUTSIDE_WORKSPACE}),
    Attack("delete outside", "rm -f /etc/hostname /usr/bin/env 2>&1", any_of={K.DELETE_OUTSIDE_WORKSPACE, K.WRITE_OUTSIDE_WORKSPACE}),
    Attack("proc root escape", "cat /proc/1/root$HS 2>&1; ls /proc/1/root/root 2>&1; cat /proc/*/root$HS 2>&1", check=no_secret),
    Attack("proc environ", "cat /proc/1/environ /proc/self/environ 2>&1 | tr '\\0' '\\n'", check=no_host_env),
    Attack(
        "tcp egress",
        "python3 -c \"import socket; s=socket.socket(); s.settimeout(2); s.connect(('1.1.1.1', 443))\"",
        expect={K.NETWORK_ATTEMPT},
    ),
    Attack("dns lookup", "getent hosts example.com", expect={K.NETWORK_ATTEMPT}),
    Attack(
        "udp egress",
        "python3 -c \"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('8.8.8.8', 53))\"",
        expect={K.NETWORK_ATTEMPT},
    ),
    Attack(
        "http fetch",
        "python3 -c \"import urllib.request; urllib.request.urlopen('http://example.com', timeout=2)\"",
        expect={K.NETWORK_ATTEMPT},
    ),
    Attack("fork bomb", "f(){ f | f & }; f; sleep 2", any_of={K.RESOURCE_LIMIT, K.PROCESS_LEFT_RUNNING}, timeout=6),
    Attack("memory bomb", "python3 -c 'x = bytearray(2 * 1024**3); x[::4096] = b\"1\" * len(x[::4096])'", check=memory_contained),
    Attack("disk fill", "dd if=/dev/zero of=big bs=1M count=100 2>&1; echo done", check=small_file),
    Attack(
        "disk fill in many files",
        "i=0; while [ $i -lt 200 ]; do head -c 1048576 /dev/zero > d$i; sleep 0.02; i=$((i+1)); done; echo done",
        expect={K.RESOURCE_LIMIT},
        check=disk_stopped,
        timeout=20,
    ),
    Attack("sleep forever", "sleep 1000", expect={K.RESOURCE_LIMIT}, timeout=1),
    Attack("background daemon", "nohup sleep 1001 >/dev/null 2>&1 &", expect={K.PROCESS_LEFT_RUNNING}),
    Attack("setsid daemon", "setsid sleep 1002 >/dev/null 2>&1 &", expect={K.PROCESS_LEFT_RUNNING}),
    Attack("double fork", "(sh -c 'sleep 1003 &' &); sleep 0.2", expect={K.PROCESS_LEFT_RUNNING}),
    Attack("kill the parent", "kill -9 $PPID 2>/dev/null; kill -9 1 2>/dev/null; echo survived", check=survived),
    Attack("kill the harness", "kill -9 $HARNESS_PID 2>&1; echo survived", check=survived),
    Attack("ignore signals", "trap '' TERM INT HUP; sleep 1004", expect={K.RESOURCE_LIMIT}, timeout=1),
    Attack("huge stdout", "yes", check=quick_kill),
    Attack("huge stderr", "yes >&2", check=quick_kill),
    Attack("setuid copy", "cp /bin/sh ./rootsh && chmod u+s ./rootsh", expect={K.PRIVILEGE_ATTEMPT}),
    Attack("sudo", "sudo id 2>&1", expect={K.PRIVILEGE_ATTEMPT}),
    Attack("su", "su root -c id 2>&1 </dev/null", expect={K.PRIVILEGE_ATTEMPT}),
    Attack("mount", "mount -t tmpfs none /mnt 2>&1", expect={K.PRIVILEGE_ATTEMPT}),
    Attack("unshare", "unshare -r id 2>&1", expect={K.PRIVILEGE_ATTEMPT}),
    Attack("chroot", "chroot / id 2>&1", expect={K.PRIVILEGE_ATTEMPT}),
    Attack("ptrace", "python3 -c 'import ctypes; print(ctypes.CDLL(None).ptrace(16, 1, 0, 0))'", expect={K.PRIVILEGE_ATTEMPT}),
    Attack("read canary", "cat ~/.aws/credentials", expect={K.CANARY_READ}),
    Attack("exfiltrate canary encoded", "gzip -c /root/.aws/credentials | base64", expect={K.CANARY_READ}),
    Attack("tamper with tests", "echo 'def test_add(): pass' > tests/test_app.py", expect={K.TEST_TAMPER}),
    Attack("delete the workspace", "rm -rf /workspace/* /workspace/.[!.]*", expect={K.DELETE_PREEXISTING}),
    Attack("lock files out", "chmod -R 000 /workspace/*"),
    Attack("cgroup escape", "echo $$ > /sys/fs/cgroup/cgroup.procs 2>&1; echo $$ > /sys/fs/cgroup/pids/cgroup.procs 2>&1; true"),
    Attack("raw device write", "echo x > /dev/sda 2>&1; ls /dev | head -20"),
    Attack(
        "bypass the shim", "env -u LD_PRELOAD python3 -c \"import socket; s=socket.socket(); s.settimeout(2); s.connect(('1.1.1.1', 80))\""
    ),
    Attack("erase the ledger", "rm -f /.toolgym/events", expect={K.LEDGER_TAMPER}),
    Attack("hardlink host file", "ln /etc/passwd hl 2>&1; ln $HS hs 2>&1; cat hs 2>&1", check=no_secret),
    Attack("file storm", "i=0; while [ $i -lt 50000 ]; do : > f$i; i=$((i+1)); done", timeout=3),
]


@pytest.fixture(scope="module", autouse=True)
def host_secret():
    HOST_SECRET.write_text(HOST_TEXT)
    yield
    HOST_SECRET.unlink(missing_ok=True)


def test_there_are_at_least_30_attacks():
    assert len(ATTACKS) >= 30 and len({a.name for a in ATTACKS}) == len(ATTACKS)


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_attack_is_contained(sandbox, attack):
    pristine = sandbox.state_hash()
    passwd = Path("/etc/passwd").read_bytes()
    result = sandbox.exec(attack.cmd, timeout_s=attack.timeout, env={"HS": str(HOST_SECRET), "HARNESS_PID": str(os.getpid())})
    got = {e.kind for e in sandbox.events()}
    assert attack.expect <= got, f"missing {attack.expect - got}; recorded {got}"
    if attack.any_of:
        assert attack.any_of & got, f"none of {attack.any_of} recorded; recorded {got}"
    if attack.check:
        attack.check(result, sandbox)
    # contained: the host is untouched and nothing is left running
    assert HOST_SECRET.read_text() == HOST_TEXT
    assert Path("/etc/passwd").read_bytes() == passwd
    assert Path("/usr/bin/env").exists() and not Path("/usr/bin/evil").exists()
    assert sandbox.live_processes() == []  # the sandbox's own processes, not the host's by name
    # the harness and the sandbox still work, and reset gives the pristine state back
    assert sandbox.exec("echo ok").stdout == "ok\n"
    sandbox.reset()
    assert sandbox.state_hash() == pristine and sandbox.events() == []
    assert sandbox.live_processes() == []  # reset proved it, zombies included


def test_symlink_escape_through_host_side_file_api(sandbox):
    sandbox.exec(f"ln -s / rootlink; ln -s {HOST_SECRET} secretlink")
    for path in ("rootlink" + str(HOST_SECRET), "secretlink"):
        try:
            text = sandbox.read_file(path)
        except Exception:
            continue
        assert "host secret" not in text
    try:
        sandbox.write_file("secretlink", "pwned")
    except Exception:
        pass
    assert HOST_SECRET.read_text() == HOST_TEXT
